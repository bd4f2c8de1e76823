"""What this machine has, and the checks on it before Ray starts (GPUs, driver, network, Ray, RLRIG_RESOURCES)."""
