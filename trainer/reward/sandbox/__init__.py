"""`rlrig sandbox`: a local service speaking SandboxFusion's /run_code protocol, for code rewards without a
SandboxFusion deployment. protocol: the request and response; languages: what runs and how; isolation: the walls
around a submission; runner: one submission start to end; server: HTTP; cli: the subcommand; local: one started
beside a training run."""
