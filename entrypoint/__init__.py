"""rlrig's per-node entrypoint: launcher detection -> node spec -> preflight -> cluster -> command."""
