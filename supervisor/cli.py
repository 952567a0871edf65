"""``sentin8-proxy``: run | check-config [--print-defaults] | reload | demo | probe, ``--version``, and the
management commands (``supervisor.mgmt_cli``)."""

from __future__ import annotations

import argparse
import json
import sys

from sentin8.config import Config, ConfigError, load_file, to_toml_dict
from sentin8.startup_checks import check_paths

from . import mgmt_cli, probe_cmd

EXIT_CONFIG = 2


def _load(path: str) -> Config:
    try:
        cfg = load_file(path)
        check_paths(cfg)
    except ConfigError as exc:
        print(f"sentin8-proxy: config error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    from sentin8.waf import check_policy  # loads the rule set: only worth it once the file itself is valid

    problem = check_policy(cfg.policy)
    if problem is not None:
        print(f"sentin8-proxy: config error: {problem}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)
    return cfg


class _VersionAction(argparse.Action):
    """``--version``: computed when asked (one ``git`` call in a checkout), not each time the CLI starts."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: object) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and revision"
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        import sentin8
        from sentin8.version import describe

        print(describe(sentin8.BUILD))
        parser.exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sentin8-proxy", description="Sentin8:Proxy, the platform's ingress")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run the fleet in the foreground (systemd runs this)")
    p_run.add_argument("--config", required=True, metavar="FILE")
    p_run.add_argument(
        "--beside-running-fleet",
        action="store_true",
        help="upgrade step: share the listen ports with the fleet already on them (see docs/upgrades.md)",
    )
    p_check = sub.add_parser("check-config", help="validate FILE and print the effective config")
    p_check.add_argument("file", metavar="FILE", nargs="?")
    p_check.add_argument(
        "--print-defaults",
        action="store_true",
        help="print the annotated example configuration (every key at its default) and exit",
    )
    p_reload = sub.add_parser("reload", help="SIGHUP the running fleet; with --wait, report how it ended")
    p_reload.add_argument(
        "--config", required=True, metavar="FILE", help="the fleet's config (finds its supervisor without --pid)"
    )
    p_reload.add_argument("--pid", type=int, default=0, help="the supervisor (default: the one running this config)")
    p_reload.add_argument("--wait", action="store_true", help="wait for the reload; exit 1 if refused or failed")
    p_reload.add_argument("--timeout", type=float, default=0, help="--wait limit in s (default: 2 x drain + 60)")
    p_demo = sub.add_parser("demo", help="the embedded default: fleet + a demo TLS backend, unprivileged ports")
    p_demo.add_argument("--https-port", type=int, default=8443)
    p_demo.add_argument("--workers", type=int, default=0)
    probe_cmd.add_parser(sub)
    mgmt_cli.add_parsers(sub)
    args = parser.parse_args(argv)
    if args.command == "probe":
        return probe_cmd.run(args)

    if args.command in mgmt_cli.COMMANDS:
        return mgmt_cli.run(args)

    if args.command == "check-config":
        if args.print_defaults:
            from sentin8 import data

            sys.stdout.write(data.read_text(data.EXAMPLE_CONFIG))
            return 0
        if args.file is None:
            p_check.error("FILE is required (or --print-defaults)")
        cfg = _load(args.file)
        print(json.dumps(to_toml_dict(cfg), indent=2))
        return 0
    if args.command == "run":
        from .arbiter import run

        return run(args.config, _load(args.config), beside=args.beside_running_fleet)
    if args.command == "reload":
        from .reload_cmd import reload

        try:
            cfg = load_file(args.config)  # only for the default --timeout: no file checks here
        except ConfigError as exc:
            print(f"sentin8-proxy: config error: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        return reload(args.config, cfg.fleet.drain_timeout_s, args.pid, args.wait, args.timeout)
    from .demo import run_demo

    return run_demo(args.https_port, args.workers)


if __name__ == "__main__":
    sys.exit(main())
