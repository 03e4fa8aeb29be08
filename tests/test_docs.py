"""What the documentation shows a user to type exists: every `mdot COMMAND --flag` in the
README, the docs, the model cards and the results pages is a flag of that command (a study
page names the flags of what it built, deleted where it was not adopted: not checked)."""

import argparse
import re
from pathlib import Path

from mdot_jax.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/*.md", "checkpoints/*/README.md", "benchmarks/results/*/README.md"]


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every option of `parser` and of its subcommands, nested."""
    out: set[str] = set()
    for action in parser._actions:
        out.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _flags(sub)
    return out


def test_every_flag_the_docs_show_exists():
    commands = {name: _flags(sub) for action in build_parser()._actions
                if isinstance(action, argparse._SubParsersAction)
                for name, sub in action.choices.items()}
    shown, missing = 0, []
    for page in sorted(p for pattern in PAGES for p in REPO.glob(pattern)):
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for m in re.finditer(r"mdot ([a-z][\w-]*)((?: +[^`|;]*)?)", line):
                if m.group(1) not in commands:
                    continue
                for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", m.group(2)):
                    shown += 1
                    if flag not in commands[m.group(1)]:
                        missing.append(f"{page.relative_to(REPO)}:{n}: mdot {m.group(1)} {flag}")
    assert shown > 100 and not missing, missing
