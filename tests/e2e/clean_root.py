#!/usr/bin/env python3
"""Makes a minimal Debian root from this machine's installed packages.

   clean_root.py ROOT PACKAGE...

ROOT gets the files of Debian's Essential packages and of the PACKAGEs, and
of everything they need (Pre-Depends and Depends, recursively, resolved among
the installed packages), plus a dpkg database that lists exactly those: what
apt would put on a fresh Debian 12 before installing a package that depends on
the PACKAGEs; and what the installer adds, /dev's basic nodes and /etc/hosts
(so it needs root). No network and no mirror: the files are this machine's. Prints
the packages' names and the root's size.
"""

import os
import re
import socket
import stat
import subprocess
import sys


def installed_packages():
    fmt = (
        "${Package}\t${binary:Package}\t${db:Status-Abbrev}\t${Essential}\t${Pre-Depends}\t"
        "${Depends}\t${Provides}\n"
    )
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", fmt], check=True, capture_output=True, text=True
    ).stdout
    packages, providers = {}, {}
    for line in out.splitlines():
        name, arch_name, status, essential, pre, depends, provides = line.split("\t")
        if not status.startswith("ii"):
            continue
        packages[name] = (essential == "yes", relations(pre) + relations(depends), arch_name)
        for virtual in relations(provides):
            providers.setdefault(virtual[0], []).append(name)
    return packages, providers


def relations(text):
    """'a (>= 1) | b:any, c' -> [['a', 'b'], ['c']]."""
    result = []
    for group in filter(None, (g.strip() for g in text.split(","))):
        result.append([re.sub(r"[ (].*|:.*", "", alt.strip()) for alt in group.split("|")])
    return result


def closure(roots, packages, providers):
    def resolve(alternatives):
        for name in alternatives:
            if name in packages:
                return name
            if name in providers:
                return providers[name][0]
        raise SystemExit(f"clean_root: no installed package satisfies {' | '.join(alternatives)}")

    wanted, todo = set(), list(roots)
    while todo:
        name = resolve([todo.pop()])
        if name in wanted:
            continue
        wanted.add(name)
        todo.extend(resolve(group) for group in packages[name][1])
    return sorted(wanted)


def main():
    root, names = sys.argv[1], sys.argv[2:]
    packages, providers = installed_packages()
    essential = [name for name, (is_essential, _, _) in packages.items() if is_essential]
    wanted = closure(essential + names, packages, providers)
    os.makedirs(root, exist_ok=True)
    # A merged /usr, as this machine (and a fresh Debian 12) has it.
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink("/" + top) and not os.path.lexists(os.path.join(root, top)):
            target = os.readlink("/" + top)
            os.makedirs(os.path.join(root, target), exist_ok=True)
            os.symlink(target, os.path.join(root, top))
    admin = os.path.join(root, "var/lib/dpkg")
    for sub in ("info", "updates", "triggers"):
        os.makedirs(os.path.join(admin, sub), exist_ok=True)
    paths = []
    for name in wanted:
        listing = subprocess.run(
            ["dpkg-query", "-L", name], check=True, capture_output=True, text=True
        ).stdout
        listed = [p for p in listing.splitlines() if p.startswith("/")]
        paths.extend(p.lstrip("/") for p in listed if p != "/." and os.path.lexists(p))
        # dpkg's list of the package's files, as on a real installation.
        with open(os.path.join(admin, "info", packages[name][2] + ".list"), "w") as f:
            f.write("\n".join(listed) + "\n")
    tar = subprocess.Popen(
        ["tar", "-C", "/", "--no-recursion", "-cf", "-", "-T", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    untar = subprocess.Popen(
        ["tar", "-C", root, "--keep-directory-symlink", "-xf", "-"], stdin=tar.stdout
    )
    tar.stdout.close()
    tar.stdin.write("\n".join(paths).encode() + b"\n")
    tar.stdin.close()
    if tar.wait() != 0 or untar.wait() != 0:
        raise SystemExit("clean_root: copying the packages' files failed")
    status = subprocess.run(
        ["dpkg-query", "-s"] + wanted, check=True, capture_output=True, text=True
    ).stdout
    with open(os.path.join(admin, "status"), "w") as f:
        f.write(status)
    open(os.path.join(admin, "available"), "w").close()
    # What an installed system has that no package makes: the device nodes
    # programs open, and the /etc/hosts Debian's installer writes (torchrun
    # resolves "localhost", and its workers MASTER_ADDR, the host's name).
    os.makedirs(os.path.join(root, "dev/shm"), exist_ok=True)
    for name, minor in (("null", 3), ("zero", 5), ("random", 8), ("urandom", 9)):
        node = os.path.join(root, "dev", name)
        if not os.path.lexists(node):
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
            os.chmod(node, 0o666)
    with open(os.path.join(root, "etc/hosts"), "w") as f:
        f.write(
            f"127.0.0.1\tlocalhost\n127.0.1.1\t{socket.gethostname()}\n"
            "::1\t\tlocalhost ip6-localhost ip6-loopback\n"
        )
    size = subprocess.run(
        ["du", "-sm", root], check=True, capture_output=True, text=True
    ).stdout.split()[0]
    print(f"clean_root: {len(wanted)} packages, {size} MiB: {' '.join(wanted)}")


if __name__ == "__main__":
    main()
