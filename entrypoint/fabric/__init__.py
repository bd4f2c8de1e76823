"""The fabric check: the network between the nodes and their GPUs' health, measured before the command."""
