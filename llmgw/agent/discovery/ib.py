"""InfiniBand and RoCE adapters, read from ``/sys/class/infiniband``.

Sysfs rather than ``ibstat``: it needs no package, no root and no subprocess,
and it is a few small files per port, so the heartbeat re-reads it every time.
A port that went down used to be invisible until the agent restarted, and the
node went on being offered multi-node work that hung on its first collective.

Every file is optional. Drivers differ in what they expose (a RoCE port has no
meaningful ``VL15_dropped``; some counters answer EINVAL), and a node whose
adapter has one odd file must still register, so anything missing or
unreadable reads as its default and is never an exception.

GUIDs are written ``0x`` and sixteen hex digits, the form ``sminfo`` and OpenSM
use, so a port's GUID and a subnet manager's compare as strings.
"""

from __future__ import annotations

import re
from pathlib import Path

from llmgw.core.inventory import Hca, HcaPort

ROOT = Path("/sys/class/infiniband")
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")
# An IPv4-mapped IPv6 address (::ffff:a.b.c.d) as sysfs writes a GID.
_IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except (OSError, ValueError):
        # EINVAL from an unused GID attribute, EACCES, a file gone mid-read.
        return ""


def _after_colon(text: str) -> str:
    """``"4: ACTIVE"`` as ``"ACTIVE"``; text without the number is kept as it is."""
    number, sep, rest = text.partition(":")
    return rest.strip() if sep and number.strip().isdigit() else text


def _rate_gbps(text: str) -> float:
    """``"400 Gb/sec (4X NDR)"`` as 400.0; anything else as 0.0."""
    m = _RATE.match(text)
    return float(m.group(1)) if m else 0.0


def guid(text: str) -> str:
    """``"9803:9b03:0067:1234"`` or ``"0x98039b0300671234"`` as ``"0x98039b0300671234"``."""
    digits = text.strip().lower().removeprefix("0x").replace(":", "")
    if not digits or any(c not in "0123456789abcdef" for c in digits):
        return ""
    return f"0x{int(digits, 16):016x}"


def _gid_halves(gid: str) -> tuple[str, str]:
    """(prefix, interface id) of a GID, each as ``0x`` + 16 hex digits; ("", "") if unreadable."""
    digits = gid.replace(":", "")
    if len(digits) != 32:
        return "", ""
    return guid(digits[:16]), guid(digits[16:])


def _roce_v2_index(port: Path) -> int:
    """The lowest GID index whose type is RoCE v2 and whose GID is an IPv4 address; -1 if none.

    NCCL over RoCE needs this index (NCCL_IB_GID_INDEX). The link-local v1 and
    v2 GIDs come first in the table, and choosing one of them makes traffic
    that crosses an IP router fail to connect.
    """
    types = port / "gid_attrs" / "types"
    try:
        indices = sorted(int(p.name) for p in types.iterdir() if p.name.isdigit())
    except OSError:
        return -1
    for k in indices:
        if _read(types / str(k)) == "RoCE v2" and _read(port / "gids" / str(k)).lower().startswith(_IPV4_MAPPED):
            return k
    return -1


def _netdev(hca: Path, port: Path, num: int, gid_index: int) -> str:
    """The network interface behind a port: the GID's ndev, else the one PCI netdev for this port."""
    for k in (gid_index, 0):
        if k >= 0 and (name := _read(port / "gid_attrs" / "ndevs" / str(k))):
            return name
    try:
        nets = sorted(p for p in (hca / "device" / "net").iterdir())
    except OSError:
        return ""
    if len(nets) == 1:
        return nets[0].name
    # A dual-port adapter has one netdev per port; dev_port counts from 0.
    return next((n.name for n in nets if _read(n / "dev_port") == str(num - 1)), "")


def _counters(port: Path) -> tuple[tuple[str, int], ...]:
    """Every readable counter under ``counters/``, raw (``port_*_data`` counts 4-byte words)."""
    try:
        files = sorted(port.joinpath("counters").iterdir())
    except OSError:
        return ()
    out: list[tuple[str, int]] = []
    for f in files:
        value = _read(f)
        if value.isdigit():
            out.append((f.name, int(value)))
    return tuple(out)


def _port(hca: Path, port: Path) -> HcaPort:
    num = int(port.name)
    prefix, port_guid = _gid_halves(_read(port / "gids" / "0"))
    layer = _read(port / "link_layer")
    gid_index = _roce_v2_index(port) if layer == "Ethernet" else -1
    return HcaPort(
        port=num,
        state=_after_colon(_read(port / "state")),
        phys_state=_after_colon(_read(port / "phys_state")),
        rate_gbps=_rate_gbps(_read(port / "rate")),
        link_layer=layer,
        port_guid=guid(_read(port / "port_guid")) or port_guid,
        gid_prefix=guid(_read(port / "subnet_prefix")) or prefix,
        roce_v2_gid_index=gid_index,
        counters=_counters(port),
        netdev=_netdev(hca, port, num, gid_index),
    )


def read_hcas(*, root: Path = ROOT) -> tuple[Hca, ...]:
    """Every adapter under ``root`` with its ports, sorted by name; () when there is no such directory."""
    try:
        adapters = sorted(root.iterdir())
    except OSError:
        return ()
    out: list[Hca] = []
    for hca in adapters:
        try:
            ports = sorted((p for p in (hca / "ports").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        except OSError:
            ports = []
        out.append(Hca(name=hca.name, node_guid=guid(_read(hca / "node_guid")),
                       ports=tuple(_port(hca, p) for p in ports)))
    return tuple(out)
