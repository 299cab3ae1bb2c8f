"""The flag references of docs/launcher.md and docs/daemon.md, made from
`meshrun --help` and `meshrun-rdzvd --help`, so the docs cannot drift from
the binaries: with --check (DocsTest.flags in ctest) it fails when a doc's
table differs from what the binaries say; with --write it rewrites them.

A meshrun flag's torchrun column says whether torchrun 2 (the venv's torch)
has a flag of that name.

Usage: flag-reference.py --meshrun BIN --rdzvd BIN (--check | --write)
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BEGIN = "<!-- BEGIN flag reference: scripts/flag-reference.py writes it from --help -->"
END = "<!-- END flag reference -->"
# CLI11 writes an option's names and value in a 30-column field, then its
# text; a longer field puts the text on the next lines.
FIELD = 30
OPTION = re.compile(r"^  (-\S+)(?: (\S.*))?$")


def options(help_text: str) -> list[tuple[list[str], str, str]]:
    """(names, value, description) of each option CLI11's help lists."""
    out: list[tuple[list[str], str, str]] = []
    in_options = False
    for line in help_text.splitlines():
        if line.startswith("Options:"):
            in_options = True
            continue
        if not in_options or not line.strip():
            continue
        head, text = line, ""
        if len(line) > FIELD and line[FIELD - 1] == " ":
            head, text = line[:FIELD], line[FIELD:].strip()
        match = OPTION.match(head.rstrip())
        if match:
            names = match.group(1).split(",")
            out.append((names, (match.group(2) or "").strip(), text))
        elif line.startswith("    ") and out:
            names, value, text = out[-1]
            out[-1] = (names, value, (text + " " + line.strip()).strip())
    return out


def torchrun_flags() -> set[str]:
    from torch.distributed.run import get_args_parser

    return {name for action in get_args_parser()._actions for name in action.option_strings}


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(help_text: str, torchrun: set[str] | None) -> str:
    head = "| flag | value=default | torchrun 2 | what it does |" if torchrun else ""
    rows = [head or "| flag | value=default | what it does |"]
    rows.append("|---|---|---|---|" if torchrun else "|---|---|---|")
    for names, value, text in options(help_text):
        long = [n for n in names if n.startswith("--")]
        if long[0] in ("--help",):
            continue
        shown = ", ".join(f"`{n}`" for n in names if "_" not in n)
        columns = [shown, f"`{cell(value)}`" if value else ""]
        if torchrun is not None:
            columns.append("same" if set(names) & torchrun else "meshrun only")
        columns.append(cell(text))
        rows.append("| " + " | ".join(columns) + " |")
    return "\n".join(rows) + "\n"


def replace(doc: str, generated: str) -> str:
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    return doc[:start] + "\n\n" + generated + "\n" + doc[end:]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--rdzvd", required=True)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--write", action="store_true")
    args = parser.parse_args()

    def help_of(binary: str) -> str:
        return subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout

    wanted = {
        os.path.join(ROOT, "docs", "launcher.md"): table(help_of(args.meshrun), torchrun_flags()),
        os.path.join(ROOT, "docs", "daemon.md"): table(help_of(args.rdzvd), None),
    }
    stale = []
    for path, generated in wanted.items():
        with open(path) as f:
            doc = f.read()
        if BEGIN not in doc or END not in doc:
            print(f"{path}: no flag reference markers", file=sys.stderr)
            return 1
        updated = replace(doc, generated)
        if updated == doc:
            continue
        if args.write:
            with open(path, "w") as f:
                f.write(updated)
            print(f"wrote {path}")
        else:
            stale.append(path)
            sys.stdout.writelines(
                difflib.unified_diff(doc.splitlines(True), updated.splitlines(True), path, "--help")
            )
    if stale:
        print(
            f"{', '.join(stale)}: the flag reference differs from --help; "
            "run scripts/flag-reference.py --write",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
