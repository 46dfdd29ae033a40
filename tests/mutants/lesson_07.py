"""Realistic wrong versions of lesson 07 (the per-node launcher), and an honest different one.

Each entry rewrites the reference solution: `old` must appear exactly once in
solutions/07_multinode/launch.py and becomes `new`. A mutant must be rejected by the
tests whose names contain `caught_by`; an alternative must pass every test of the
lesson. tests/mutants/test_mutants.py applies them.
"""

FILE = "07_multinode/launch.py"

MUTANTS = [
    dict(
        name="no_endpoint_check",
        why="the launcher trusts the endpoint and starts torchrun at once: a wrong address "
        "waits in the rendezvous for many minutes",
        old="    while True:\n",
        new="    return 0.0\n    while True:\n",
        caught_by="wrong_endpoint",
    ),
    dict(
        name="gives_up_at_the_first_refusal",
        why="one connection attempt: a node started a moment before node 0 fails",
        old="            if time.monotonic() - start >= timeout:\n",
        new="            if True:\n",
        caught_by="two_launchers",
    ),
    dict(
        name="no_nnodes",
        why="torchrun is not told the number of nodes: each node forms a job of its own",
        old='        f"--nnodes={args.nnodes}", ',
        new="        ",
        caught_by="dry_run",
    ),
    dict(
        name="nproc_from_nnodes",
        why="processes per node taken from the number of nodes",
        old='f"--nproc_per_node={args.nproc_per_node}",\n',
        new='f"--nproc_per_node={args.nnodes}",\n',
        caught_by="dry_run",
    ),
    dict(
        name="exit_code_dropped",
        why="the launcher waits for torchrun and exits 0 whatever the job did",
        old="    return subprocess.call(command)\n",
        new="    subprocess.call(command)\n    return 0\n",
        caught_by="failed_job",
    ),
    dict(
        name="max_restarts_ignored",
        why="--max-restarts never reaches torchrun: a failed rank always ends the job",
        old='        f"--max_restarts={args.max_restarts}", args.script, *args.script_args,\n',
        new='        "--max_restarts=0", args.script, *args.script_args,\n',
        caught_by="dry_run",
    ),
]

ALTERNATIVES = [
    dict(
        name="connect_ex_with_a_deadline",
        why="a raw socket and connect_ex against a deadline, no exception handling",
        old="""    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout)):
                return time.monotonic() - start
        except OSError as err:
            if time.monotonic() - start >= timeout:
                raise ConnectionError(
                    f"cannot reach node 0's rendezvous at {host}:{port} after {timeout:g} s "
                    f"({err.strerror or err}): check --endpoint (node 0's address, reachable "
                    "from here), the firewall (this TCP port must be open), and that node 0's "
                    "launcher is running"
                ) from None
            time.sleep(0.5)
""",
        new="""    deadline = start + timeout
    while time.monotonic() < deadline:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            if sock.connect_ex((host, port)) == 0:
                return time.monotonic() - start
        time.sleep(0.25)
    raise ConnectionError(f"{host}:{port} did not answer within {timeout:g} s; is node 0 up?")
""",
    ),
]
