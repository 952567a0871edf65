"""Hostile and odd ClientHellos, each with the answer a reference OpenSSL 3.5 ``s_server`` gives (TLS 1.3 only,
X25519MLKEM768, ML-DSA-65, the same certificate the proxy serves), recorded byte for byte.

An answer is what a client sees: ``"serverhello"`` (the handshake goes on), or the bytes before the close in
hex and how the connection ended: ``"1503030002020a fin"`` is an ``unexpected_message`` alert then a FIN;
``"fin"`` a close without a byte; ``"reset"`` would be an RST (ECONNRESET on read), which no case expects.

``python -m tests.tls_reference [--proxy HOST:PORT]`` replays every case against a live reference (Debian 13's
OpenSSL 3.5 from the bench tree, through chroot; ``tests/openssl_cli.py``) and optionally a running proxy
serving ``SNI`` with ``CERT_DIR``'s pair, and prints both answers side by side (from loopback a proxy takes
its L4 path, so only the peek's own answers compare there: run it from an external address, e.g. under
``ip netns exec``, for the L7 path). The tests do both over real sockets (``tests/test_tls_front_door.py``),
with the live reference when it is there and the recorded answers always.

Where the proxy answers differently on purpose, the case says so (``proxy``) and why (``why``); README, "One
connection on :443", step 2 lists the same differences.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

from tests import hellos
from tests.openssl_cli import BENCH_TREE, FIXTURES, find_openssl35
from tests.tls13raw import (
    EXT_ALPN,
    EXT_ECH,
    EXT_SERVER_NAME,
    EXT_SUPPORTED_GROUPS,
    EXT_SUPPORTED_VERSIONS,
    X25519MLKEM768,
    ClientHello,
    KeyShares,
    alpn,
    grease_ech,
    pq_hello,
    server_name,
    u16,
    vec8,
    vec16,
)

SNI = "seed-priv.openssl.test"
CERT_DIR = FIXTURES / "seed-priv"  # fullchain.pem + privkey.pem, made by OpenSSL 3.5 (tests/openssl_cli.py)
SERVERHELLO = "serverhello"


@dataclass(frozen=True)
class Case:
    name: str
    wire: bytes
    reference: str  # the reference's answer, recorded from it
    fin: bool = False  # the client half-closes after sending
    peek: bool = False  # the proxy's peek answers it (on L4 and L7 alike); else the TLS server that terminates
    proxy: str = ""  # the proxy's answer where it differs on purpose ("" = the reference's)
    why: str = ""

    @property
    def expected(self) -> str:
        return self.proxy or self.reference


# -- building blocks -------------------------------------------------------------------------------------


def _hello(**kw) -> ClientHello:
    return pq_hello(SNI, KeyShares(), **kw)


def _with(h: ClientHello, etype: int, data: bytes) -> ClientHello:
    h.extensions.append((etype, data))
    return h


def _replace(h: ClientHello, etype: int, data: bytes) -> ClientHello:
    h.extensions = [(t, data if t == etype else d) for t, d in h.extensions]
    return h


def _without(h: ClientHello, etype: int) -> ClientHello:
    h.extensions = [(t, d) for t, d in h.extensions if t != etype]
    return h


def _record(ctype: int, version: int, payload: bytes) -> bytes:
    return bytes((ctype,)) + u16(version) + vec16(payload)


def _records(msg: bytes, size: int = 16384, version: int = 0x0301) -> bytes:
    return b"".join(_record(0x16, version, msg[i : i + size]) for i in range(0, len(msg), size))


def _body_edit(h: ClientHello, edit) -> bytes:
    """The hello's record with its body bytes changed by ``edit(bytearray)``, lengths refitted."""
    body = bytearray(h.message()[4:])
    edit(body)
    msg = b"\x01" + len(body).to_bytes(3, "big") + bytes(body)
    return _record(0x16, 0x0301, msg)


def padded_message(total: int) -> bytes:
    """A ClientHello handshake message of exactly ``total`` bytes (an unknown extension carries the padding,
    then GREASE cipher suites once the extension block is full)."""
    h = _hello()
    room = 65535 - len(b"".join(u16(t) + vec16(d) for t, d in h.extensions)) - 4
    need = total - len(h.message()) - 4
    h.extensions.append((0xFFF0, bytes(min(need, room))))
    rest = total - len(h.message())
    if rest:
        h.suites = (*h.suites, *(0x0A0A,) * (rest // 2))
    msg = h.message()
    assert len(msg) == total, (len(msg), total)
    return msg


def _partial() -> tuple[bytes, bytes]:
    """A hello split after its first 600-byte record: (that record, the rest)."""
    records = hellos.reframe(_hello().record(), 600)
    return records[:605], records[605:]


def _one_byte_records() -> bytes:
    return hellos.reframe(_hello().record(), 1)


def _v2_hello(version: int) -> bytes:
    suites = bytes.fromhex("000039000038000035000033000032000004000005")
    body = b"\x01" + u16(version) + u16(len(suites)) + u16(0) + u16(16) + suites + bytes(16)
    return bytes((0x80 | len(body) >> 8, len(body) & 0xFF)) + body


ZERO_HS = b"\x16\x03\x01\x00\x00"
ZERO_CCS = b"\x14\x03\x03\x00\x00"
UNEXPECTED = "1503030002020a fin"
OVERFLOW = "15030300020216 fin"
ILLEGAL = "1503030002022f fin"
DECODE = "15030300020232 fin"
PROTOCOL = "15030300020246 fin"
UNRECOGNIZED_NAME = "15030300020270 fin"
SILENT = "fin"


def cases() -> list[Case]:
    """Fresh cases (new key shares each call)."""
    part, rest = _partial()
    ones = _one_byte_records()
    hello = _hello().record()
    msg_16k = padded_message(16384)
    return [
        # -- records before the ClientHello --------------------------------------------------------------
        Case("zero_length_application_data", b"\x17\x03\x03\x00\x00", UNEXPECTED, peek=True),
        Case("zero_length_application_data_tls10", b"\x17\x03\x01\x00\x00", "1503010002020a fin", peek=True),
        Case("zero_length_alert", b"\x15\x03\x03\x00\x00", UNEXPECTED, peek=True),
        Case("zero_length_alert_version_03ff", b"\x15\x03\xff\x00\x00", "1503ff0002020a fin", peek=True),
        Case("zero_length_ccs_then_hello", ZERO_CCS + hello, SERVERHELLO),
        Case("zero_length_handshake_then_hello", ZERO_HS + hello, SERVERHELLO),
        Case("32_empty_records_then_hello", (ZERO_HS + ZERO_CCS) * 16 + hello, SERVERHELLO),
        Case("33_empty_records_then_hello", ZERO_CCS + ZERO_HS * 32 + hello, UNEXPECTED, peek=True),
        Case("ccs_then_hello", b"\x14\x03\x03\x00\x01\x01" + hello, UNEXPECTED, peek=True),
        Case("ccs_tls10", b"\x14\x03\x01\x00\x01\x01", UNEXPECTED, peek=True),
        Case("application_data", b"\x17\x03\x03\x00\x05hello", UNEXPECTED, peek=True),
        Case("application_data_tls10", b"\x17\x03\x01\x00\x01\x00", "1503010002020a fin", peek=True),
        Case("warning_close_notify", b"\x15\x03\x03\x00\x02\x01\x00", UNEXPECTED, peek=True),
        Case("fatal_alert", b"\x15\x03\x03\x00\x02\x02\x28", UNEXPECTED, peek=True),
        Case("heartbeat_tls10", b"\x18\x03\x01\x00\x01\x00", "1503010002020a fin", peek=True),
        Case("unknown_content_type", b"\x19\x03\x01\x00\x01\x00", "1503010002020a fin", peek=True),
        Case("content_type_0", b"\x00\x03\x03\x00\x01\x00", UNEXPECTED, peek=True),
        Case("http_get", b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", SILENT, peek=True),
        Case("http_connect", b"CONNECT a.test:443 HTTP/1.1\r\n\r\n", SILENT, peek=True),
        Case("record_major_4", b"\x16\x04\x00\x00\x05hello", SILENT, peek=True),
        Case("record_major_2", b"\x16\x02\x00\x00\x05hello", SILENT, peek=True),
        Case("record_version_0300", _hello().record(0x0300), SERVERHELLO),
        Case("record_version_03ff", _hello().record(0x03FF), SERVERHELLO),
        Case(
            "sslv2_client_hello",
            _v2_hello(0x0303),
            PROTOCOL,
            peek=True,
            proxy=SILENT,
            why="OpenSSL 4.0 (the proxy's TLS library) no longer reads SSLv2-format hellos: not TLS, no alert",
        ),
        # -- record_overflow: a record longer than 2^14, judged on its header ----------------------------
        Case("record_length_16385_header_only", b"\x16\x03\x01\x40\x01", OVERFLOW, peek=True),
        Case("record_length_16385", _record(0x16, 0x0301, bytes(16385)), OVERFLOW, peek=True),
        Case("record_length_16641", b"\x16\x03\x01\x41\x01", OVERFLOW, peek=True),
        Case("record_length_65535", b"\x16\x03\x02\xff\xff", OVERFLOW, peek=True),
        Case("application_data_length_65535", b"\x17\x03\xff\xff\xff", OVERFLOW, peek=True),
        Case("record_overflow_in_a_later_record", part + b"\x16\x03\x01\x40\x01", OVERFLOW, peek=True),
        Case("record_overflow_with_major_4", b"\x16\x04\x01\x40\x01", SILENT, peek=True),
        # -- later records of a hello --------------------------------------------------------------------
        Case("later_record_major_4", part + b"\x16\x04\x01" + rest[3:], PROTOCOL, peek=True),
        Case("later_record_http", part + b"GET / HTTP/1.1\r\n\r\n", PROTOCOL, peek=True),
        Case("later_zero_length_ccs", part + ZERO_CCS + rest, UNEXPECTED, peek=True),
        Case("later_ccs", part + b"\x14\x03\x03\x00\x01\x01" + rest, UNEXPECTED, peek=True),
        Case("later_zero_length_application_data", part + b"\x17\x03\x03\x00\x00", UNEXPECTED, peek=True),
        Case("later_zero_length_alert_03ff", part + b"\x15\x03\xff\x00\x00", "1503ff0002020a fin", peek=True),
        Case("later_warning_alert", part + b"\x15\x03\x03\x00\x02\x01\x00", UNEXPECTED, peek=True),
        Case("later_32_empty_handshake_records", part + ZERO_HS * 32 + rest, SERVERHELLO),
        Case("later_33_empty_handshake_records", part + ZERO_HS * 33 + rest, UNEXPECTED, peek=True),
        Case("zero_ccs_before_handshake_header_complete", ones[:18] + ZERO_CCS + ones[18:], SERVERHELLO),
        Case("zero_ccs_after_handshake_header_complete", ones[:24] + ZERO_CCS + ones[24:], UNEXPECTED, peek=True),
        Case("later_record_version_0305", part + b"\x16\x03\x05" + rest[3:], SERVERHELLO),
        Case("hello_in_one_byte_records", ones, SERVERHELLO),
        # -- the handshake message -----------------------------------------------------------------------
        Case("server_hello_instead", b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", UNEXPECTED, peek=True),
        Case("finished_instead", b"\x16\x03\x01\x00\x04\x14\x00\x00\x00", UNEXPECTED, peek=True),
        Case("hello_length_131397", b"\x16\x03\x01\x00\x04\x01\x02\x01\x45", ILLEGAL, peek=True),
        Case("hello_length_2_24_minus_1", b"\x16\x03\x01\x00\x04\x01\xff\xff\xff", ILLEGAL, peek=True),
        Case("hello_too_short", b"\x16\x03\x01\x00\x08\x01\x00\x00\x04\x03\x03\x00\x00", DECODE, peek=True),
        Case("maximal_single_record_hello", _records(msg_16k), SERVERHELLO),
        Case("maximal_record_hello_split_in_two", _records(msg_16k, 10000), SERVERHELLO),
        Case(
            "hello_over_the_cap",
            _records(padded_message(40000)),
            SERVERHELLO,
            peek=True,
            proxy=ILLEGAL,
            why="over limits.peek_max_bytes: the alert the reference sends for a hello over its own limit",
        ),
        # -- the connection ends (FIN) before the hello is complete --------------------------------------
        Case("fin_without_a_byte", b"", DECODE, fin=True, peek=True),
        Case("fin_after_3_bytes", hello[:3], DECODE, fin=True, peek=True),
        Case("fin_after_a_record_header", hello[:5], DECODE, fin=True, peek=True),
        Case("fin_in_the_first_record", hello[:100], DECODE, fin=True, peek=True),
        Case("fin_between_records", part, DECODE, fin=True, peek=True),
        Case("fin_after_a_zero_length_ccs", ZERO_CCS, DECODE, fin=True, peek=True),
        # -- legacy_version (RFC 8446 §4.2.1: ignored when supported_versions is there) ----------------------
        Case("legacy_version_ffff_with_supported_versions", _hello(legacy_version=0xFFFF).record(), SERVERHELLO),
        Case("legacy_version_0400_with_supported_versions", _hello(legacy_version=0x0400).record(), SERVERHELLO),
        Case("legacy_version_0200_with_supported_versions", _hello(legacy_version=0x0200).record(),
             "15020000020246 fin"),
        Case("legacy_version_0002_with_supported_versions", _hello(legacy_version=0x0002).record(),
             "15000200020246 fin"),
        Case("legacy_version_ffff_alone", _without(_hello(legacy_version=0xFFFF), EXT_SUPPORTED_VERSIONS).record(),
             "15ffff00020246 fin"),
        Case("legacy_version_0400_alone", _without(_hello(legacy_version=0x0400), EXT_SUPPORTED_VERSIONS).record(),
             "15040000020246 fin"),
        Case("legacy_version_0303_alone", _without(_hello(), EXT_SUPPORTED_VERSIONS).record(), PROTOCOL),
        Case(
            "legacy_version_0300_with_supported_versions",
            _hello(legacy_version=0x0300).record(),
            "15030000020228 fin",
            proxy="15030000020246 fin",
            why="OpenSSL 4.0 answers an SSL 3.0 legacy_version with protocol_version where 3.5 said handshake_failure",
        ),
        Case("supported_versions_tls12_only", _replace(_hello(), EXT_SUPPORTED_VERSIONS, vec8(u16(0x0303))).record(),
             PROTOCOL),
        # -- the hello's body ----------------------------------------------------------------------------
        Case("session_id_of_33_bytes", _hello(session_id=bytes(33)).record(), DECODE, peek=True),
        Case("cipher_suites_odd_length",
             _body_edit(_hello(session_id=b""), lambda b: b.__setitem__(slice(35, 37), b"\x00\x05")), DECODE,
             peek=True),
        Case("cipher_suites_empty",
             _body_edit(_hello(session_id=b""), lambda b: b.__setitem__(slice(35, 43), b"\x00\x00")), DECODE,
             peek=True),
        Case("no_compression_methods", _hello(compression=b"").record(), DECODE, peek=True),
        Case("compression_without_null", _hello(compression=b"\x01").record(), ILLEGAL),
        Case("trailing_byte_after_extensions", _body_edit(_hello(), lambda b: b.append(0)), DECODE, peek=True),
        Case("no_extensions",
             _body_edit(_hello(session_id=b""), lambda b: b.__delitem__(slice(2 + 32 + 1 + 2 + 6 + 2, None))),
             PROTOCOL),
        Case("two_server_names", _with(_hello(), EXT_SERVER_NAME, server_name("b.test")).record(), ILLEGAL, peek=True),
        Case("two_alpn", _with(_hello(), EXT_ALPN, alpn(b"http/1.1")).record(), ILLEGAL, peek=True),
        Case("two_supported_groups", _with(_hello(), EXT_SUPPORTED_GROUPS, vec16(u16(X25519MLKEM768))).record(),
             ILLEGAL),
        Case("two_identical_grease_extensions", _with(_with(_hello(), 0x0A0A, b""), 0x0A0A, b"").record(), SERVERHELLO),
        # -- server_name ---------------------------------------------------------------------------------
        Case("sni_extension_empty", _replace(_hello(), EXT_SERVER_NAME, b"").record(), DECODE, peek=True),
        Case("sni_list_empty", _replace(_hello(), EXT_SERVER_NAME, vec16(b"")).record(), DECODE, peek=True),
        Case("sni_type_1", _replace(_hello(), EXT_SERVER_NAME, vec16(b"\x01" + vec16(b"a.test"))).record(), DECODE,
             peek=True),
        Case("sni_type_1_then_host_name",
             _replace(_hello(), EXT_SERVER_NAME, vec16(b"\x01" + vec16(b"a.test") + b"\x00" + vec16(SNI.encode())))
             .record(), DECODE, peek=True),
        Case("sni_two_host_names",
             _replace(_hello(), EXT_SERVER_NAME, vec16(b"\x00" + vec16(b"a.test") + b"\x00" + vec16(b"b.test")))
             .record(), DECODE, peek=True),
        Case("sni_trailing_byte", _replace(_hello(), EXT_SERVER_NAME, server_name(SNI) + b"\x00").record(), DECODE,
             peek=True),
        Case("sni_with_nul", _replace(_hello(), EXT_SERVER_NAME, server_name("a\x00.test")).record(),
             UNRECOGNIZED_NAME, peek=True),
        Case("sni_of_256_bytes", _replace(_hello(), EXT_SERVER_NAME, server_name("a" * 256)).record(),
             UNRECOGNIZED_NAME, peek=True),
        Case("sni_upper_case", _replace(_hello(), EXT_SERVER_NAME, server_name(SNI.upper())).record(), SERVERHELLO),
        Case("sni_trailing_dot", _replace(_hello(), EXT_SERVER_NAME, server_name(SNI + ".")).record(), SERVERHELLO),
        Case(
            "sni_empty_name",
            _replace(_hello(), EXT_SERVER_NAME, vec16(b"\x00" + vec16(b""))).record(),
            SERVERHELLO,
            peek=True,
            proxy=UNRECOGNIZED_NAME,
            why="a router cannot serve a name that is not a DNS hostname; the reference has no names to choose",
        ),
        Case(
            "sni_with_a_space",
            _replace(_hello(), EXT_SERVER_NAME, server_name("a b.test")).record(),
            SERVERHELLO,
            peek=True,
            proxy=UNRECOGNIZED_NAME,
            why="a router cannot serve a name that is not a DNS hostname; the reference has no names to choose",
        ),
        Case(
            "sni_not_ascii",
            _replace(_hello(), EXT_SERVER_NAME, vec16(b"\x00" + vec16("ä.test".encode()))).record(),
            SERVERHELLO,
            peek=True,
            proxy=UNRECOGNIZED_NAME,
            why="a router cannot serve a name that is not a DNS hostname; the reference has no names to choose",
        ),
        # -- ALPN ----------------------------------------------------------------------------------------
        Case("alpn_empty_protocol", _replace(_hello(), EXT_ALPN, vec16(b"\x00")).record(), DECODE, peek=True),
        Case("alpn_empty_list", _replace(_hello(), EXT_ALPN, vec16(b"")).record(), DECODE, peek=True),
        Case("alpn_truncated", _replace(_hello(), EXT_ALPN, vec16(b"\x05ab")).record(), DECODE, peek=True),
        # -- encrypted_client_hello ----------------------------------------------------------------------
        Case("ech_grease", _with(_hello(), EXT_ECH, grease_ech(random.Random(7))).record(), SERVERHELLO),
        Case("ech_inner_type", _with(_hello(), EXT_ECH, b"\x01").record(), SERVERHELLO),
        Case(
            "ech_empty",
            _with(_hello(), EXT_ECH, b"").record(),
            SERVERHELLO,
            proxy=ILLEGAL,
            why="OpenSSL 4.0 reads ECH (3.5 does not know the extension); an empty one is no ECHClientHello",
        ),
    ]


# -- probing ---------------------------------------------------------------------------------------------


def _is_server_hello(data: bytes) -> bool:
    return len(data) >= 6 and data[0] == 0x16 and data[1] == 3 and data[5] == 0x02


def answer(sock: socket.socket, wire: bytes, fin: bool = False, timeout: float = 5.0) -> str:
    """Send ``wire`` (then a FIN when ``fin``) on a connected socket and describe what comes back."""
    sock.settimeout(timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if wire:
        sock.sendall(wire)
    if fin:
        sock.shutdown(socket.SHUT_WR)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                end = "fin"
                break
            got += chunk
            if _is_server_hello(got):
                return SERVERHELLO
    except ConnectionResetError:
        end = "reset"
    except TimeoutError:
        end = "timeout"
    finally:
        sock.close()
    return f"{got.hex()} {end}" if got else end


class ReferenceServer:
    """``openssl s_server`` (OpenSSL >= 3.5) on a loopback port: TLS 1.3 only, X25519MLKEM768, ML-DSA-65,
    ``CERT_DIR``'s pair. Through chroot when the tool is the bench tree's (the files are copied into it)."""

    def __init__(self, argv: list[str]) -> None:
        self.port = 0
        self._argv = argv
        self._dir = ""
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ReferenceServer:
        chroot = self._argv[0] == "chroot"
        parent = str(BENCH_TREE / "tmp") if chroot else None
        self._dir = tempfile.mkdtemp(prefix="s8ref", dir=parent)
        for name in ("fullchain.pem", "privkey.pem"):
            shutil.copy(CERT_DIR / name, self._dir)
        inside = "/" + os.path.relpath(self._dir, BENCH_TREE) if chroot else self._dir
        for _attempt in range(5):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            self.proc = subprocess.Popen(
                [*self._argv, "s_server", "-accept", f"127.0.0.1:{self.port}", "-tls1_3",
                 "-groups", "X25519MLKEM768", "-sigalgs", "mldsa65", "-www",
                 "-cert", f"{inside}/fullchain.pem", "-key", f"{inside}/privkey.pem"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._listening():
                return self
            self.proc.kill()
            self.proc.wait()
        raise RuntimeError("s_server did not start")

    def _listening(self) -> bool:
        """Poll with a deadline (another process's state; its stdout is block-buffered on a pipe)."""
        deadline = time.monotonic() + 20
        while self.proc is not None and self.proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def answer(self, case: Case) -> str:
        return answer(socket.create_connection(("127.0.0.1", self.port)), case.wire, case.fin)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proxy", help="HOST:PORT of a proxy serving SNI with CERT_DIR's pair")
    args = parser.parse_args()
    tool = find_openssl35()
    if tool is None:
        print("no OpenSSL >= 3.5 CLI (host or bench tree)")
        return 1
    width = max(len(c.name) for c in cases())
    same = True
    with ReferenceServer(tool) as ref:
        for case in cases():
            live = ref.answer(case)
            line = f"{case.name:{width}}  reference {live:22}"
            if live != case.reference:
                line += f"  (recorded {case.reference})"
                same = False
            if args.proxy:
                host, port = args.proxy.rsplit(":", 1)
                got = answer(socket.create_connection((host, int(port))), case.wire, case.fin)
                line += f"  proxy {got:22}" + ("" if got == case.expected else f"  (expected {case.expected})")
                same = same and got == case.expected
            print(line)
            time.sleep(0.01)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
