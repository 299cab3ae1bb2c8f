"""Docs that cannot rot (issue 33): run by ctest as DocsTest.*.

links:  every relative link in README.md and docs/*.md names a file of the
        repository, and its #anchor a heading of that file.
readme: the README stays short (at most 250 lines), and its layout table
        matches the folders: every folder it names exists, and every
        top-level folder of the repository is in it.
paths:  recorded results (bench/) and docs name paths from the checkout,
        never a machine's (/work/..., /home/..., /root/...); every recorded
        result names the commit it ran at and the machine.
commands: each README command block marked "<!-- runnable" runs from the
        checkout and exits 0 (meshrun from the build, workers under the
        venv's python), in a network namespace of its own (the ctest command
        runs this under unshare --net --mount). The marker's settings say how:
        nodes=N runs the block N times at once, as N nodes; hosts=A,B names
        hosts that resolve to this machine; X=Y runs the user's file Y where
        the block names X (train.py); expect=TEXT must be in the output.
flags:  docs/launcher.md's and docs/daemon.md's flag references are what
        `meshrun --help` and `meshrun-rdzvd --help` say
        (scripts/flag-reference.py --check).

Usage: docs_test.py [--meshrun BIN --rdzvd BIN] CASE
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

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
    # A recorded result says where and on what it ran (notes need not).
    commit = re.compile(r"(meshrun:|commit|\bat)\s+`?[0-9a-f]{7,40}\b")
    unnamed = []
    for path in records:
        if not path.endswith(".md") or "notes" in os.path.basename(path).lower():
            continue
        with open(path) as f:
            text = f.read()
        if not commit.search(text) or "achine" not in text:
            unnamed.append(os.path.relpath(path, ROOT))
    assert not unnamed, "recorded results that name no commit or machine: " + ", ".join(unnamed)
    print(
        f"ok: {len(records)} recorded results name their commit and machine; they and "
        f"{len(docs())} docs name no machine's paths"
    )


@dataclasses.dataclass
class Runnable:
    """A README command block and how its marker says to run it."""

    command: str
    nodes: int = 1
    hosts: list[str] = dataclasses.field(default_factory=list)
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    expect: str = ""


def parse_marker(marker: str) -> Runnable:
    """`<!-- runnable nodes=2 hosts=node0 train.py=examples/ddp_train.py: why -->`"""
    settings = marker.removeprefix("<!-- runnable").split(":", 1)[0].split()
    runnable = Runnable(command="")
    for setting in settings:
        key, _, value = setting.partition("=")
        assert value, f"marker setting {setting!r} is not KEY=VALUE: {marker}"
        if key == "nodes":
            runnable.nodes = int(value)
        elif key == "hosts":
            runnable.hosts = value.split(",")
        elif key == "expect":
            runnable.expect = value
        else:
            assert os.path.exists(os.path.join(ROOT, value)), f"{marker}: no file {value}"
            runnable.files[key] = value
    return runnable


def runnable_blocks(path: str, runners: set[str]) -> list[Runnable]:
    """The command blocks right after a "<!-- runnable" comment. A command
    block with no marker fails, as does "<!-- runnable by NAME,..." naming
    neither a test of `runners` nor a file of the checkout (.ci/run)."""
    blocks: list[Runnable] = []
    block: list[str] = []
    unmarked: list[str] = []
    state, marked = "prose", Runnable(command="")
    with open(path) as f:
        for number, line in enumerate(f, 1):
            stripped = line.strip()
            by = re.match(r"<!-- runnable by (\S+?):", stripped)
            if state == "prose" and by:
                for name in by.group(1).split(","):
                    assert known_runner(name, runners), (
                        f"README.md:{number}: no test or file {name}"
                    )
                state = "elsewhere"
            elif state == "prose" and stripped.startswith("<!-- not runnable:"):
                state = "elsewhere"
            elif state == "prose" and stripped.startswith("<!-- runnable"):
                state, marked = "marked", parse_marker(stripped)
            elif state == "prose" and stripped == "```sh":
                unmarked.append(f"README.md:{number}")
                state = "code"
            elif state == "elsewhere" and FENCE.match(stripped):
                state = "code"
            elif state == "marked" and FENCE.match(stripped):
                state, block = "marked code", []
            elif state == "marked code" and FENCE.match(stripped):
                command = "".join(block)
                for name, path_in_checkout in marked.files.items():
                    command = re.sub(
                        rf"(?<![\w/.]){re.escape(name)}(?![\w.])", path_in_checkout, command
                    )
                blocks.append(dataclasses.replace(marked, command=command))
                state = "prose"
            elif state == "marked code":
                block.append(line)
            elif state == "code" and FENCE.match(stripped):
                state = "prose"
    assert not unmarked, "command blocks without a runnable marker: " + ", ".join(unmarked)
    return blocks


@functools.cache
def registered_tests() -> set[str]:
    """The names tests/CMakeLists.txt gives add_test, with each
    `foreach(VAR a b c)` expanded, whether this build registers them or not
    (the sanitizer build has no worker library)."""
    with open(os.path.join(ROOT, "tests", "CMakeLists.txt")) as f:
        text = f.read()
    names = set(re.findall(r"add_test\(NAME ([\w.]+)\s", text))
    for var, values, body in re.findall(r"foreach\((\w+) ([^)]*)\)(.*?)endforeach\(\)", text, re.S):
        if values.startswith("IN "):
            continue  # a list variable: not expanded here
        for group in re.findall(rf"add_test\(NAME ([\w.]+)\$\{{{var}\}}", body):
            names.update(group + value for value in values.split())
    return names


def known_runner(name: str, runners: set[str]) -> bool:
    """A test of this build, a test that tests/CMakeLists.txt registers in a
    build with more parts, or a file."""
    return name in runners or name in registered_tests() or os.path.isfile(os.path.join(ROOT, name))


def ctest_names(build_dir: str) -> set[str]:
    """The names of the build's tests (ctest -N)."""
    listed = subprocess.run(
        ["ctest", "--test-dir", build_dir, "-N"], capture_output=True, text=True, check=True
    ).stdout
    return set(re.findall(r"^\s*Test\s+#\d+: (\S+)", listed, re.M))


def resolve_hosts(hosts: list[str]) -> None:
    """Make each of `hosts` this machine's loopback, inside this process's own
    mount namespace (unshare --mount): /etc/hosts is bind-mounted over."""
    if not hosts:
        return
    with open("/etc/hosts") as f:
        current = f.read()
    fd, path = tempfile.mkstemp(prefix="docs_test_hosts.")
    with os.fdopen(fd, "w") as f:
        f.write(current + "".join(f"127.0.0.1 {host}\n" for host in hosts))
    subprocess.run(["mount", "--bind", path, "/etc/hosts"], check=True)
    os.unlink(path)  # the mount holds the file; nothing is left in /tmp


def run_block(runnable: Runnable, env: dict[str, str]) -> None:
    """Runs the block as its nodes, all at once, each bounded; all must exit 0."""
    resolve_hosts(runnable.hosts)
    # Each node's output goes to a file: a pipe left unread while another
    # node is waited for could fill and stall the job.
    logs = [tempfile.TemporaryFile(mode="w+") for _ in range(runnable.nodes)]
    nodes = [
        subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", runnable.command],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for log in logs
    ]
    failures: list[str] = []
    outputs: list[str] = []
    try:
        deadline = time.monotonic() + 240
        for number, (node, log) in enumerate(zip(nodes, logs, strict=True)):
            node.wait(timeout=max(0.0, deadline - time.monotonic()))
            log.seek(0)
            output = log.read()
            outputs.append(output)
            if node.returncode != 0:
                failures.append(f"node {number}: exit {node.returncode}:\n{output}")
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    assert not failures, runnable.command + "\n".join(failures)
    expected = runnable.expect in "".join(outputs)
    assert expected, f"{runnable.command}no {runnable.expect!r} in:\n" + "".join(outputs)


def case_commands(args: argparse.Namespace) -> None:
    bindir = os.path.dirname(os.path.abspath(args.meshrun))
    blocks = runnable_blocks(os.path.join(ROOT, "README.md"), ctest_names(os.path.dirname(bindir)))
    assert blocks, "no runnable block in README.md"
    # The network namespace of the ctest command starts with loopback down.
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env = dict(
        os.environ,
        PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
        PYTHON_EXEC=sys.executable,
    )
    for block in blocks:
        run_block(block, env)
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
