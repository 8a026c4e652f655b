"""A HermesCLI in its own process, driven over stdin/stdout JSON lines (clikit.CliProcess).

``python cli_driver.py --hermes chat -q TEXT -Q [--resume SESSION]`` runs the real
``hermes`` command instead (one-shot, one process per call).

``python cli_driver.py --home $HERMES_HOME [--resume SESSION] [--reviews]``: like a
second terminal running ``hermes -c SESSION`` on the same home (``--reviews``: with
the host's background review forks, each run and checked before the answer that
follows it, reported as ``forks``: reviewkit.ForkGate). Requests, one JSON
object a line: {"op": "hello"|"chat"|"command"|"retry"|"history"|"edit"|
"engine"|"exit", ...}; each gets one JSON answer line (always with the CLI's
current ``session_id``). The CLI's own printing goes to /dev/null; only loopback
connections are allowed (hostkit.NetworkGuard).
"""
import argparse
import json
import os
import sys
import traceback


def hermes_command(argv: list) -> int:
    """``cli_driver.py --hermes chat -q TEXT ...``: the real ``hermes`` entry point
    (hermes_cli.main.main, what the console script runs) under the network guard."""
    import hostkit as hk

    with hk.NetworkGuard() as guard:
        from hermes_cli.main import main as hermes_main

        sys.argv = ["hermes"] + argv
        try:
            code = hermes_main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if guard.blocked:
        print(f"network access attempted: {guard.blocked}", file=sys.stderr)
        return 3
    return int(code or 0)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--hermes":
        return hermes_command(sys.argv[2:])
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", required=True)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--reviews", action="store_true")
    args = parser.parse_args()
    os.environ["HERMES_HOME"] = args.home
    os.environ.setdefault("HERMES_EXIT_WATCHDOG_S", "0")
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    devnull = open(os.devnull, "w", encoding="utf-8")
    os.dup2(devnull.fileno(), 1)
    sys.stdout = devnull

    import hostkit as hk

    guard = hk.NetworkGuard().__enter__()
    import clikit

    cli_mod = clikit.point_cli_at(args.home)
    from hermes_cli.plugins import discover_plugins
    discover_plugins()
    import reviewkit

    cli = reviewkit.hermes_cli(cli_mod, resume=args.resume, reviews=args.reviews)
    clikit.skip_terminal_waits(cli_mod, cli)
    gate = reviewkit.ForkGate(args.home).install() if args.reviews else None
    if args.resume:
        cli._preload_resumed_session()

    def answer(payload: dict) -> None:
        payload["session_id"] = cli.session_id
        if gate is not None:   # this process's forks end before the walk goes on
            gate.run()
            forks = gate.take_report()
            if forks.forks or forks.problems or forks.late:
                payload["forks"] = forks.as_dict()
        if guard.blocked:
            payload["error"] = f"network access attempted: {guard.blocked}"
        proto.write(json.dumps(payload, default=str) + "\n")
        proto.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        op = request.get("op")
        try:
            if op == "hello":
                answer({})
            elif op == "chat":
                answer({"reply": cli.chat(request["text"])})
            elif op == "command":
                cli.process_command(request["text"])
                answer({})
            elif op == "retry":
                cli.process_command("/retry")
                reply = None
                if not cli._pending_input.empty():
                    reply = cli.chat(cli._pending_input.get_nowait())
                answer({"reply": reply})
            elif op == "history":
                answer({"history": cli.conversation_history})
            elif op == "edit":
                cli.conversation_history[request["index"]]["content"] = request["content"]
                answer({})
            elif op == "engine":
                engine = cli.agent.context_compressor if cli.agent else None
                answer({"compression_count": getattr(engine, "compression_count", None),
                        "threshold_tokens": getattr(engine, "threshold_tokens", None),
                        "engine_session": getattr(engine, "session_id", None)})
            elif op == "exit":
                cli_mod._cleanup_done = False
                cli_mod._active_agent_ref = cli.agent
                cli_mod._run_cleanup()
                answer({})
                break
            else:
                answer({"error": f"unknown op {op!r}"})
        except Exception as exc:  # the parent raises it with the traceback
            answer({"error": f"{exc!r}\n{traceback.format_exc()}"})
    if gate is not None:
        gate.uninstall()
    if cli.agent is not None:
        try:
            cli.agent.close()
        except Exception:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
