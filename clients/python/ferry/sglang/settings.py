"""The SGLang adapter's settings (see :mod:`ferry.sglang`): what a manager constructed as SGLang
constructs it (``KVManager(args, disaggregation_mode, server_args, is_mla_backend)``, with no
Ferry argument) takes from SGLang's ``server_args`` and ``KVArgs`` and from ``FERRY_*``
environment variables. docs/integration.md lists them.
"""

from __future__ import annotations

import os
import re
import string
from dataclasses import dataclass
from typing import Any, Mapping, Optional

DEFAULT_SOCKET = "/run/ferry/{mode}-{gpu_id}/ferryd.sock"
"""Where a rank's ferryd listens by default: one per GPU and side, the place systemd gives
``ferryd@prefill-0`` (``RuntimeDirectory=ferry/%i``) with ``listen.client:
${RUNTIME_DIRECTORY}/ferryd.sock``."""

SOCKET_FIELDS = ("mode", "engine_rank", "tp_rank", "pp_rank", "dp_rank", "gpu_id")
"""The fields a ``FERRY_SOCKET`` template may name."""

_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds") from None
    if not v > 0:
        raise ValueError(f"{name}={raw!r}: expected a positive number of seconds")
    return v


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected 1 or 0 (true/false, yes/no, on/off)")


def host_port(addr: str, what: str) -> tuple[str, int]:
    """``("host", port)`` of ``host:port`` or ``[v6]:port``; ValueError naming ``what``."""
    m = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\s]+):(\d+)", addr.strip())
    if m is None or not 0 < int(m.group(2) or m.group(4)) < 65536:
        raise ValueError(f"{what}={addr!r}: expected host:port")
    return (m.group(1) or m.group(3)), int(m.group(2) or m.group(4))


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def socket_path(template: str, fields: Mapping[str, Any], what: str = "FERRY_SOCKET") -> str:
    """``template`` with its ``{field}``s filled from ``fields`` (:data:`SOCKET_FIELDS`)."""
    names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    unknown = [f for f in names if f not in SOCKET_FIELDS]
    if unknown:
        raise ValueError(f"{what}={template!r} names {{{unknown[0]}}}: a socket template may "
                         f"name {', '.join('{' + f + '}' for f in SOCKET_FIELDS)}")
    return template.format(**fields)


def bootstrap_addr_of(server_args: Any) -> Optional[str]:
    """Where SGLang's prefill ranks register: the bootstrap server's ``host:port``, from
    ``server_args.disaggregation_bootstrap_port`` and the host of ``dist_init_addr`` (several
    nodes) or ``host`` (a wildcard as loopback), as SGLang's ``register_to_bootstrap``. None
    without a bootstrap port."""
    port = getattr(server_args, "disaggregation_bootstrap_port", None)
    if server_args is None or port is None:
        return None
    dist = getattr(server_args, "dist_init_addr", None)
    if dist:
        host = host_port(str(dist), "server_args.dist_init_addr")[0]
    else:
        host = str(getattr(server_args, "host", "") or "")
    return join_host_port(_WILDCARDS.get(host, host), int(port))


@dataclass
class FerrySettings:
    """A manager's Ferry settings. :meth:`derive` fills them as docs/integration.md lists."""

    socket_path: str = ""
    """The local ferryd's client socket (``FERRY_SOCKET``, a template, default
    :data:`DEFAULT_SOCKET`)."""
    bootstrap_addr: Optional[str] = None
    """Where a prefill rank registers (``FERRY_BOOTSTRAP_ADDR``, else from ``server_args``);
    None: it registers with no bootstrap server."""
    control_addr: Optional[str] = None
    """The control address a prefill rank registers (``FERRY_CONTROL_ADDR``); None: its
    ferryd's (``listen.control``, from the hello)."""
    timeout: float = 30.0
    """Each request to ferryd (``FERRY_TIMEOUT``)."""
    register_timeout: float = 30.0
    """How long the constructor retries lending the memory and registering the rank with the
    bootstrap server (``FERRY_REGISTER_TIMEOUT``)."""
    drain_timeout: float = 10.0
    """``failure_exception()``'s wait for a room's drain (``FERRY_DRAIN_TIMEOUT``)."""
    reconnect: bool = True
    """Whether the client reconnects when ferryd goes away (``FERRY_RECONNECT``)."""
    http_timeout: float = 5.0
    """Each request to a bootstrap server (``FERRY_BOOTSTRAP_HTTP_TIMEOUT``; SGLang's 5 s)."""
    checksums: bool = False
    """A decode rank asks for every room it prepares to be checked end to end
    (``FERRY_CHECKSUMS``; protocol v10's ``prepare.checksum``), as a ferryd with
    ``integrity.checksums`` checks all its rooms."""

    @classmethod
    def derive(cls, args: Any, mode: str, server_args: Any = None,
               environ: Optional[Mapping[str, str]] = None) -> FerrySettings:
        """From ``FERRY_*`` in ``environ`` (default ``os.environ``), the ``KVArgs`` (the socket
        template's ranks) and SGLang's ``server_args`` (the bootstrap server's address).
        Raises ValueError naming a variable that does not parse."""
        env = os.environ if environ is None else environ
        engine_rank = int(getattr(args, "engine_rank", 0) or 0)
        fields = {"mode": mode, "engine_rank": engine_rank, "tp_rank": engine_rank,
                  "pp_rank": int(getattr(args, "pp_rank", 0) or 0),
                  "dp_rank": int(getattr(args, "system_dp_rank", 0) or 0),
                  "gpu_id": int(getattr(args, "gpu_id", 0) or 0)}
        boot = env.get("FERRY_BOOTSTRAP_ADDR") or None
        if boot is not None:
            boot = join_host_port(*host_port(boot, "FERRY_BOOTSTRAP_ADDR"))
        else:
            boot = bootstrap_addr_of(server_args)
        control = env.get("FERRY_CONTROL_ADDR") or None
        if control is not None:
            control = join_host_port(*host_port(control, "FERRY_CONTROL_ADDR"))
        return cls(socket_path=socket_path(env.get("FERRY_SOCKET") or DEFAULT_SOCKET, fields),
                   bootstrap_addr=boot, control_addr=control,
                   timeout=_float(env, "FERRY_TIMEOUT", cls.timeout),
                   register_timeout=_float(env, "FERRY_REGISTER_TIMEOUT", cls.register_timeout),
                   drain_timeout=_float(env, "FERRY_DRAIN_TIMEOUT", cls.drain_timeout),
                   reconnect=_bool(env, "FERRY_RECONNECT", cls.reconnect),
                   http_timeout=_float(env, "FERRY_BOOTSTRAP_HTTP_TIMEOUT", cls.http_timeout),
                   checksums=_bool(env, "FERRY_CHECKSUMS", cls.checksums))


def config_section(config_yaml: str, section: str) -> dict[str, int]:
    """The integer keys of a top-level section of ferryd's effective config (the hello's
    ``config_yaml``, as ``ferryd --check-config`` prints it), e.g. ``pp`` -> ``{"size": 2,
    "rank": 1}``; ``{}`` when absent."""
    out: dict[str, int] = {}
    inside = False
    for line in config_yaml.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            inside = line.split("#")[0].strip() == f"{section}:"
            continue
        m = re.fullmatch(r"  (\w+): *(-?\d+) *(#.*)?", line) if inside else None
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


__all__ = ["DEFAULT_SOCKET", "FerrySettings", "bootstrap_addr_of", "config_section"]
