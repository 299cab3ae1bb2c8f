"""Docs that cannot rot (issue 33): run by ctest as DocsTest.*.

links:  every relative link in README.md and docs/*.md names a file of the
        repository, and its #anchor a heading of that file.
readme: the README stays short (at most 250 lines), and its layout table
        matches the folders: every folder it names exists, and every
        top-level folder of the repository is in it.
paths:  recorded results (bench/) and docs name paths from the checkout,
        never a machine's (/work/..., /home/..., /root/...).
commands: each README command block marked "<!-- runnable" runs from the
        checkout and exits 0 (meshrun from the build, workers under the
        venv's python).
flags:  docs/launcher.md's and docs/daemon.md's flag references are what
        `meshrun --help` and `meshrun-rdzvd --help` say
        (scripts/flag-reference.py --check).

Usage: docs_test.py [--meshrun BIN --rdzvd BIN] CASE
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MAX_README_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def docs() -> list[str]:
    return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def prose(path: str) -> list[str]:
    """The file's lines outside code blocks."""
    lines, in_code = [], False
    with open(path) as f:
        for line in f:
            if FENCE.match(line.strip()):
                in_code = not in_code
                continue
            if not in_code:
                lines.append(line.rstrip("\n"))
    return lines


def anchors(path: str) -> set[str]:
    """GitHub's anchors for the file's headings."""
    out = set()
    for line in prose(path):
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            out.add(slug)
    return out


def case_links() -> None:
    broken = []
    for doc in docs():
        for number, line in enumerate(prose(doc), 1):
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                resolved = (
                    os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
                )
                where = f"{os.path.relpath(doc, ROOT)}:{number}: {target}"
                if not os.path.exists(resolved):
                    broken.append(f"{where} (no such file)")
                elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                    broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)
    print(f"ok: every link of {len(docs())} files resolves")


def case_readme() -> None:
    readme = os.path.join(ROOT, "README.md")
    with open(readme) as f:
        count = sum(1 for _ in f)
    assert count <= MAX_README_LINES, f"README.md has {count} lines, over {MAX_README_LINES}"
    listed = [
        m.group(1).rstrip("/")
        for line in prose(readme)
        if (m := re.match(r"^\| `([^`]+/)` \|", line))
    ]
    assert listed, "no layout table in README.md"
    missing = [
        folder
        for folder in listed
        if "<" not in folder and not os.path.isdir(os.path.join(ROOT, folder))
    ]
    assert not missing, f"the layout table names folders that do not exist: {missing}"
    tracked = subprocess.run(
        ["git", "-C", ROOT, "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    top = sorted(
        {path.split("/")[0] for path in tracked if "/" in path and not path.startswith(".")}
    )
    unlisted = [folder for folder in top if not any(f.split("/")[0] == folder for f in listed)]
    assert not unlisted, f"top-level folders missing from README.md's layout table: {unlisted}"
    print(f"ok: README.md has {count} lines; its layout table names {len(listed)} folders")


def case_paths() -> None:
    machine = re.compile(r"(?<![\w.])/(work|home|root)/[\w.-]+")
    found = []
    records = glob.glob(os.path.join(ROOT, "bench", "**", "*.md"), recursive=True)
    records += glob.glob(os.path.join(ROOT, "bench", "**", "*.json"), recursive=True)
    for path in [*docs(), *sorted(records)]:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if machine.search(line):
                    found.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "absolute paths of a machine:\n" + "\n".join(found)
    print(f"ok: {len(records)} recorded results and {len(docs())} docs name no machine's paths")


def runnable_blocks(path: str) -> list[str]:
    """The code blocks right after a "<!-- runnable" comment."""
    blocks, block, state = [], [], "prose"
    with open(path) as f:
        for line in f:
            stripped = line.strip()
            if state == "prose" and stripped.startswith("<!-- runnable"):
                state = "marked"
            elif state == "marked" and FENCE.match(stripped):
                state, block = "code", []
            elif state == "code" and FENCE.match(stripped):
                blocks.append("".join(block))
                state = "prose"
            elif state == "code":
                block.append(line)
    return blocks


def case_commands(args: argparse.Namespace) -> None:
    blocks = runnable_blocks(os.path.join(ROOT, "README.md"))
    assert blocks, "no runnable block in README.md"
    bindir = os.path.dirname(os.path.abspath(args.meshrun))
    env = dict(
        os.environ,
        PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
        PYTHON_EXEC=sys.executable,
    )
    for block in blocks:
        run = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert run.returncode == 0, f"{block}exit {run.returncode}:\n{run.stdout}{run.stderr}"
    print(f"ok: {len(blocks)} runnable README blocks ran")


def case_flags(args: argparse.Namespace) -> None:
    script = os.path.join(ROOT, "scripts", "flag-reference.py")
    subprocess.run(
        [sys.executable, script, "--meshrun", args.meshrun, "--rdzvd", args.rdzvd, "--check"],
        check=True,
    )
    print("ok: the flag references match --help")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshrun")
    parser.add_argument("--rdzvd")
    parser.add_argument("case", choices=["links", "readme", "paths", "flags", "commands"])
    args = parser.parse_args()
    if args.case == "links":
        case_links()
    elif args.case == "readme":
        case_readme()
    elif args.case == "paths":
        case_paths()
    elif args.case == "commands":
        case_commands(args)
    else:
        case_flags(args)


if __name__ == "__main__":
    main()
