"""A worker that writes its environment to DIR/TAG.RANK.env, one KEY=VALUE a
line (newlines in values as \\n), and with --probe PORT whether something
accepts TCP connections on 127.0.0.1:PORT, as the key _PROBE."""

import os
import socket
import sys


def main():
    out_dir, tag = sys.argv[1], sys.argv[2]
    env = dict(os.environ)
    if len(sys.argv) > 4 and sys.argv[3] == "--probe":
        with socket.socket() as s:
            s.settimeout(5)
            env["_PROBE"] = "1" if s.connect_ex(("127.0.0.1", int(sys.argv[4]))) == 0 else "0"
    path = os.path.join(out_dir, f"{tag}.{env['RANK']}.env")
    with open(path + ".tmp", "w") as f:
        for key in sorted(env):
            value = env[key].replace("\n", "\\n")
            f.write(f"{key}={value}\n")
    os.rename(path + ".tmp", path)


if __name__ == "__main__":
    main()
