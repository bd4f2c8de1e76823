"""Where this node stands: the launcher detected, what it says (NodeSpec), the head's address resolved."""
