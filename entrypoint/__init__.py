"""rlrig's per-node entrypoint: launcher detection -> node spec -> preflight -> cluster -> command.

Each folder is one stage and imports only the stages before it: detect/ (the launcher, its NodeSpec, the head's
address), preflight/ (what the machine has and the checks on it), cluster/ (`ray start`, the token, the head's store,
rlrig's processes), fabric/ (the network check before the command), jobs/ (a standing cluster's jobs). At the top:
cli (the `rlrig` command), bootstrap (environment -> Plan), plan, lifecycle (carries a Plan out), command (the fabric
check and the command on the formed cluster), restarts (--max-restarts), doctor, trainerfit, and errors and console,
which every stage uses.
"""
