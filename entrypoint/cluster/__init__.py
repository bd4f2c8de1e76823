"""The Ray cluster's parts: `ray start`, the token, the head's store and what nodes say there, rlrig's processes."""
