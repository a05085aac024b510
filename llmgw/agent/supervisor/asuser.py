"""Become an engine's user, then become the engine: ``python -I -S asuser.py UID GID GROUPS -- ARGV...``.

Run by the agent (as root) in place of asking Popen to switch users itself. Popen's ``user=``/``group=``
make CPython fork instead of vfork, and a fork of the agent, a process full of gRPC threads, broke its
stream to the control plane now and then ("Socket closed" the instant an engine was launched, gRPC
having logged "Other threads are currently calling into gRPC, skipping fork() handlers"). With no user
to switch, Popen vforks this small script, which drops the groups, the gid and the uid, in that order
(the uid last: after it nothing can be taken back), and execs the engine in the same process (its pid
is the one the agent recorded). Standard library only, started with ``-I -S``: it reads no environment
hook and no site-packages before the switch.
"""

import os
import sys


def main(argv: list[str]) -> None:
    if len(argv) < 6 or argv[4] != "--":
        sys.exit("usage: asuser.py UID GID GROUPS -- ARGV...")
    uid, gid = int(argv[1]), int(argv[2])
    groups = [int(g) for g in argv[3].split(",") if g]
    if uid == 0 or gid == 0 or 0 in groups:
        sys.exit("asuser.py: refusing to run an engine as root (uid, gid or a group 0)")
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    engine = argv[5:]
    try:
        os.execvp(engine[0], engine)
    except OSError as exc:
        sys.stderr.write(f"cannot start {engine[0]}: {exc.strerror or exc}; install the engine or set its path "
                         "in the agent's configuration\n")
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv)
