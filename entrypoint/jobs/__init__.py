"""A standing cluster's jobs: `rlrig up` serving them on the head; submit, status and down through its job API."""
