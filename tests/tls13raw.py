"""A small TLS 1.3 client whose ClientHello a test builds field by field, so a test can send what no TLS library
sends (a browser's GREASE values and GREASE ECH, ``legacy_version`` 0xffff) and still finish the handshake.

RFC 8446 §7 key schedule over X25519MLKEM768 (or X25519), the server's CertificateVerify checked with its
ML-DSA-65 certificate and its Finished verified, ours sent, then application data both ways. Test code only,
and deliberately not ``sentin8.tls``: a test client must not share the code it tests.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import mldsa, mlkem, x25519
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

X25519MLKEM768 = 0x11EC
X25519 = 0x001D
SECP256R1 = 0x0017
SECP384R1 = 0x0018
MLDSA65 = 0x0905
TLS13 = 0x0304
TLS12 = 0x0303

EXT_SERVER_NAME = 0x0000
EXT_STATUS_REQUEST = 0x0005
EXT_SUPPORTED_GROUPS = 0x000A
EXT_EC_POINT_FORMATS = 0x000B
EXT_SIGNATURE_ALGORITHMS = 0x000D
EXT_ALPN = 0x0010
EXT_SCT = 0x0012
EXT_EXTENDED_MASTER_SECRET = 0x0017
EXT_COMPRESS_CERTIFICATE = 0x001B
EXT_SESSION_TICKET = 0x0023
EXT_SUPPORTED_VERSIONS = 0x002B
EXT_PSK_MODES = 0x002D
EXT_KEY_SHARE = 0x0033
EXT_APPLICATION_SETTINGS = 0x44CD
EXT_ECH = 0xFE0D
EXT_RENEGOTIATION_INFO = 0xFF01

GREASE = tuple(0x0A0A + 0x1010 * i for i in range(16))  # RFC 8701
HRR_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")

# suite -> (hash, AEAD, key length)
SUITES: dict[int, tuple[Callable, type, int]] = {
    0x1301: (hashlib.sha256, AESGCM, 16),
    0x1302: (hashlib.sha384, AESGCM, 32),
    0x1303: (hashlib.sha256, ChaCha20Poly1305, 32),
}
# what Chrome 13x offers, in its order
CHROME_SUITES = (0x1301, 0x1302, 0x1303, 0xC02B, 0xC02F, 0xC02C, 0xC030, 0xCCA9, 0xCCA8, 0xC013, 0xC014,
                 0x009C, 0x009D, 0x002F, 0x0035)  # fmt: skip
CHROME_SIGALGS = (0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601)


class TLSAlert(Exception):
    def __init__(self, level: int, description: int) -> None:
        super().__init__(f"alert {level}/{description}")
        self.level = level
        self.description = description


def u8(n: int) -> bytes:
    return bytes((n,))


def u16(n: int) -> bytes:
    return n.to_bytes(2, "big")


def vec8(b: bytes) -> bytes:
    return u8(len(b)) + b


def vec16(b: bytes) -> bytes:
    return u16(len(b)) + b


def vec24(b: bytes) -> bytes:
    return len(b).to_bytes(3, "big") + b


def extension(etype: int, data: bytes) -> tuple[int, bytes]:
    return (etype, data)


def u16_list(values: tuple[int, ...] | list[int]) -> bytes:
    return b"".join(u16(v) for v in values)


class KeyShares:
    """The client's key pairs for X25519MLKEM768 (ML-KEM-768 encapsulation key, then X25519) and X25519."""

    def __init__(self) -> None:
        self.mlkem = mlkem.MLKEM768PrivateKey.generate()
        self.x25519 = x25519.X25519PrivateKey.generate()

    def key(self, group: int) -> bytes:
        x = self.x25519.public_key().public_bytes_raw()
        if group == X25519MLKEM768:
            return self.mlkem.public_key().public_bytes_raw() + x
        if group == X25519:
            return x
        raise ValueError(f"no key for group {group:#x}")

    def entry(self, group: int) -> bytes:
        return u16(group) + vec16(self.key(group))

    def shared(self, group: int, server_key: bytes) -> bytes:
        if group == X25519MLKEM768:  # server share: ML-KEM ciphertext (1088), then X25519 (32)
            peer = x25519.X25519PublicKey.from_public_bytes(server_key[1088:])
            return self.mlkem.decapsulate(server_key[:1088]) + self.x25519.exchange(peer)
        if group == X25519:
            return self.x25519.exchange(x25519.X25519PublicKey.from_public_bytes(server_key))
        raise ValueError(f"server chose group {group:#x}")


@dataclass
class ClientHello:
    suites: tuple[int, ...]
    extensions: list[tuple[int, bytes]]
    legacy_version: int = TLS12
    random: bytes = field(default_factory=lambda: os.urandom(32))
    session_id: bytes = field(default_factory=lambda: os.urandom(32))
    compression: bytes = b"\x00"

    def message(self) -> bytes:
        exts = b"".join(u16(t) + vec16(d) for t, d in self.extensions)
        body = (
            u16(self.legacy_version)
            + self.random
            + vec8(self.session_id)
            + vec16(u16_list(self.suites))
            + vec8(self.compression)
            + vec16(exts)
        )
        return b"\x01" + vec24(body)

    def record(self, version: int = 0x0301) -> bytes:
        msg = self.message()
        return b"\x16" + u16(version) + vec16(msg)


def server_name(host: str) -> bytes:
    return vec16(b"\x00" + vec16(host.encode()))


def alpn(*protocols: bytes) -> bytes:
    return vec16(b"".join(vec8(p) for p in protocols))


def pq_hello(sni: str | None, shares: KeyShares, **kw) -> ClientHello:
    """The smallest hello a PQ-only server accepts: TLS 1.3, X25519MLKEM768, ML-DSA-65, http/1.1."""
    exts = []
    if sni:
        exts.append(extension(EXT_SERVER_NAME, server_name(sni)))
    exts += [
        extension(EXT_SUPPORTED_GROUPS, vec16(u16(X25519MLKEM768))),
        extension(EXT_SIGNATURE_ALGORITHMS, vec16(u16(MLDSA65))),
        extension(EXT_SUPPORTED_VERSIONS, vec8(u16(TLS13))),
        extension(EXT_PSK_MODES, vec8(b"\x01")),
        extension(EXT_KEY_SHARE, vec16(shares.entry(X25519MLKEM768))),
        extension(EXT_ALPN, alpn(b"http/1.1")),
    ]
    return ClientHello(suites=(0x1301, 0x1302, 0x1303), extensions=exts, **kw)


def grease_ech(rng: random.Random) -> bytes:
    """A GREASE ECH outer extension as Chrome sends it (draft-ietf-tls-esni §6.2): type outer, HPKE
    HKDF-SHA256 + AES-128-GCM, a random config id, a random 32-byte X25519 ``enc`` and a random payload of a
    plausible length."""
    payload = rng.randbytes(rng.choice((144, 176, 208, 240)))
    return b"\x00" + u16(0x0001) + u16(0x0001) + u8(rng.randrange(256)) + vec16(rng.randbytes(32)) + vec16(payload)


def chrome_hello(sni: str, shares: KeyShares, rng: random.Random | None = None) -> ClientHello:
    """A ClientHello shaped like Chrome 13x's: GREASE cipher, group, key share, version and two GREASE
    extensions (first and last, with different values), the extension list permuted, GREASE ECH,
    X25519MLKEM768 + X25519 key shares, ALPS, certificate compression, SCT, OCSP. Chrome offers no ML-DSA
    signature; ``mldsa65`` is appended to its list since a PQ-only server has nothing else."""
    rng = rng or random.Random()
    g_suite, g_group, g_version, g_ext1 = (rng.choice(GREASE) for _ in range(4))
    g_ext2 = rng.choice([g for g in GREASE if g != g_ext1])
    middle = [
        extension(EXT_SERVER_NAME, server_name(sni)),
        extension(EXT_EXTENDED_MASTER_SECRET, b""),
        extension(EXT_RENEGOTIATION_INFO, b"\x00"),
        extension(EXT_SUPPORTED_GROUPS, vec16(u16_list((g_group, X25519MLKEM768, X25519, SECP256R1, SECP384R1)))),
        extension(EXT_EC_POINT_FORMATS, vec8(b"\x00")),
        extension(EXT_SESSION_TICKET, b""),
        extension(EXT_ALPN, alpn(b"h2", b"http/1.1")),
        extension(EXT_STATUS_REQUEST, b"\x01\x00\x00\x00\x00"),
        extension(EXT_SIGNATURE_ALGORITHMS, vec16(u16_list((*CHROME_SIGALGS, MLDSA65)))),
        extension(EXT_SCT, b""),
        extension(
            EXT_KEY_SHARE,
            vec16(u16(g_group) + vec16(b"\x00") + shares.entry(X25519MLKEM768) + shares.entry(X25519)),
        ),
        extension(EXT_PSK_MODES, vec8(b"\x01")),
        extension(EXT_SUPPORTED_VERSIONS, vec8(u16_list((g_version, TLS13, TLS12)))),
        extension(EXT_COMPRESS_CERTIFICATE, vec8(u16(0x0002))),  # brotli
        extension(EXT_APPLICATION_SETTINGS, vec16(vec8(b"h2"))),
        extension(EXT_ECH, grease_ech(rng)),
    ]
    rng.shuffle(middle)
    exts = [extension(g_ext1, b""), *middle, extension(g_ext2, b"\x00")]
    return ClientHello(suites=(g_suite, *CHROME_SUITES), extensions=exts)


def _hkdf_extract(hash_fn: Callable, salt: bytes, ikm: bytes) -> bytes:
    return hmac.new(salt, ikm, hash_fn).digest()


def _hkdf_expand_label(hash_fn: Callable, secret: bytes, label: bytes, context: bytes, length: int) -> bytes:
    info = u16(length) + vec8(b"tls13 " + label) + vec8(context)
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(secret, block + info + u8(i), hash_fn).digest()
        out += block
        i += 1
    return out[:length]


class _Keys:
    """One direction's record protection: AEAD key, IV and the sequence number (RFC 8446 §5.3)."""

    def __init__(self, suite: int, secret: bytes) -> None:
        hash_fn, aead, key_len = SUITES[suite]
        self.aead = aead(_hkdf_expand_label(hash_fn, secret, b"key", b"", key_len))
        self.iv = _hkdf_expand_label(hash_fn, secret, b"iv", b"", 12)
        self.seq = 0

    def _nonce(self) -> bytes:
        n = bytes(a ^ b for a, b in zip(self.iv, self.seq.to_bytes(12, "big"), strict=True))
        self.seq += 1
        return n

    def seal(self, ctype: int, data: bytes) -> bytes:
        header = b"\x17\x03\x03" + u16(len(data) + 1 + 16)
        return header + self.aead.encrypt(self._nonce(), data + u8(ctype), header)

    def open(self, header: bytes, payload: bytes) -> tuple[int, bytes]:
        inner = self.aead.decrypt(self._nonce(), payload, header).rstrip(b"\x00")
        return inner[-1], inner[:-1]


class RawTLS13Client:
    """Blocking, on a connected socket the caller made (so it can come from a network namespace)."""

    def __init__(self, sock: socket.socket, shares: KeyShares, hello: ClientHello) -> None:
        self.sock = sock
        self.shares = shares
        self.hello = hello
        self._in = bytearray()
        self._read_keys: _Keys | None = None
        self._write_keys: _Keys | None = None
        self._plain = bytearray()  # decrypted application data not yet returned
        self.suite = 0
        self.group = 0
        self.alpn: bytes | None = None
        self.certificate: x509.Certificate | None = None
        self.certificate_compressed = False

    # -- records ------------------------------------------------------------------------------------

    def _read_exact(self, n: int) -> bytes:
        while len(self._in) < n:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("connection ended")
            self._in += data
        out = bytes(self._in[:n])
        del self._in[:n]
        return out

    def _record(self) -> tuple[int, bytes]:
        """The next record, decrypted when keys are set; CCS records are dropped (RFC 8446 §5)."""
        while True:
            header = self._read_exact(5)
            payload = self._read_exact(int.from_bytes(header[3:5], "big"))
            ctype = header[0]
            if ctype == 0x14:
                continue
            if ctype == 0x17 and self._read_keys is not None:
                ctype, payload = self._read_keys.open(header, payload)
            if ctype == 0x15:
                raise TLSAlert(payload[0], payload[1])
            return ctype, payload

    def _handshake_messages(self):
        """Handshake messages, however the records split or coalesce them."""
        buf = b""
        while True:
            while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[1:4], "big"):
                ctype, payload = self._record()
                if ctype != 0x16:
                    raise ConnectionError(f"record type {ctype} during the handshake")
                buf += payload
            n = 4 + int.from_bytes(buf[1:4], "big")
            msg, buf = buf[:n], buf[n:]
            yield msg
            if not buf and self._read_keys is None:
                return  # the ServerHello's record: the next ones are under the handshake keys

    # -- handshake ----------------------------------------------------------------------------------

    def handshake(self, wire: bytes | None = None) -> None:
        """Send the hello (``wire``: these bytes instead of its one-record framing, e.g. split records), then
        finish the handshake. Raises ``TLSAlert`` when the server answers with an alert."""
        self.sock.sendall(wire if wire is not None else self.hello.record())
        transcript = self.hello.message()
        sh = next(self._handshake_messages())
        if sh[0] != 2:
            raise ConnectionError(f"expected ServerHello, got handshake type {sh[0]}")
        if sh[6:38] == HRR_RANDOM:
            raise ConnectionError("HelloRetryRequest: the server wanted another key share")
        self.suite, server_key = self._server_hello(sh[4:])
        transcript += sh
        hash_fn = SUITES[self.suite][0]
        hlen = hash_fn().digest_size
        zero = bytes(hlen)

        def derive(secret: bytes, label: bytes, msgs: bytes) -> bytes:
            return _hkdf_expand_label(hash_fn, secret, label, hash_fn(msgs).digest(), hlen)

        early = _hkdf_extract(hash_fn, zero, zero)
        hs_secret = _hkdf_extract(hash_fn, derive(early, b"derived", b""), self.shares.shared(self.group, server_key))
        c_hs, s_hs = derive(hs_secret, b"c hs traffic", transcript), derive(hs_secret, b"s hs traffic", transcript)
        self._read_keys = _Keys(self.suite, s_hs)
        messages = self._handshake_messages()
        while True:
            msg = next(messages)
            if msg[0] == 15:  # CertificateVerify over the transcript up to the Certificate
                self._check_certificate_verify(msg[4:], hash_fn(transcript).digest())
            elif msg[0] == 20:
                finished_key = _hkdf_expand_label(hash_fn, s_hs, b"finished", b"", hlen)
                expected = hmac.new(finished_key, hash_fn(transcript).digest(), hash_fn).digest()
                if not hmac.compare_digest(msg[4:], expected):
                    raise ConnectionError("server Finished does not verify")
                transcript += msg
                break
            elif msg[0] == 8:
                self._encrypted_extensions(msg[4:])
            elif msg[0] == 11:
                self._certificate(msg[4:])
            elif msg[0] == 25:
                self.certificate_compressed = True
            else:
                raise ConnectionError(f"unexpected handshake message {msg[0]}")
            transcript += msg
        master = _hkdf_extract(hash_fn, derive(hs_secret, b"derived", b""), zero)
        c_ap, s_ap = derive(master, b"c ap traffic", transcript), derive(master, b"s ap traffic", transcript)
        finished_key = _hkdf_expand_label(hash_fn, c_hs, b"finished", b"", hlen)
        verify = hmac.new(finished_key, hash_fn(transcript).digest(), hash_fn).digest()
        self._write_keys = _Keys(self.suite, c_hs)
        # middlebox compatibility (RFC 8446 §D.4), as browsers do: a CCS before the first encrypted record
        self.sock.sendall(b"\x14\x03\x03\x00\x01\x01" + self._write_keys.seal(0x16, b"\x14" + vec24(verify)))
        self._write_keys = _Keys(self.suite, c_ap)
        self._read_keys = _Keys(self.suite, s_ap)

    def _server_hello(self, body: bytes) -> tuple[int, bytes]:
        pos = 2 + 32
        pos += 1 + body[pos]
        suite = int.from_bytes(body[pos : pos + 2], "big")
        pos += 3
        end = pos + 2 + int.from_bytes(body[pos : pos + 2], "big")
        pos += 2
        version, key = 0, b""
        while pos < end:
            etype, n = struct.unpack("!HH", body[pos : pos + 4])
            data = body[pos + 4 : pos + 4 + n]
            pos += 4 + n
            if etype == EXT_SUPPORTED_VERSIONS:
                version = int.from_bytes(data, "big")
            elif etype == EXT_KEY_SHARE:
                self.group = int.from_bytes(data[:2], "big")
                key = data[4:]
        if version != TLS13:
            raise ConnectionError(f"server negotiated version {version:#x}")
        return suite, key

    def _encrypted_extensions(self, body: bytes) -> None:
        pos, end = 2, 2 + int.from_bytes(body[:2], "big")
        while pos < end:
            etype, n = struct.unpack("!HH", body[pos : pos + 4])
            if etype == EXT_ALPN:
                self.alpn = body[pos + 7 : pos + 7 + body[pos + 6]]
            pos += 4 + n

    def _certificate(self, body: bytes) -> None:
        pos = 1 + body[0] + 3  # request context, then the list's length
        n = int.from_bytes(body[pos : pos + 3], "big")
        self.certificate = x509.load_der_x509_certificate(body[pos + 3 : pos + 3 + n])

    def _check_certificate_verify(self, body: bytes, transcript_hash: bytes) -> None:
        scheme = int.from_bytes(body[:2], "big")
        signature = body[4 : 4 + int.from_bytes(body[2:4], "big")]
        if self.certificate is None:
            return  # compressed with an algorithm this client cannot undo: the Finished still proves the keys
        key = self.certificate.public_key()
        if scheme != MLDSA65 or not isinstance(key, mldsa.MLDSA65PublicKey):
            raise ConnectionError(f"server signed with {scheme:#x}")
        key.verify(signature, b" " * 64 + b"TLS 1.3, server CertificateVerify\x00" + transcript_hash)

    # -- application data ---------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        assert self._write_keys is not None, "handshake first"
        out = b""
        for i in range(0, len(data), 16384):
            out += self._write_keys.seal(0x17, data[i : i + 16384])
        self.sock.sendall(out)

    def recv(self) -> bytes:
        """The next application data; b"" after close_notify or at the end of the connection."""
        while True:
            try:
                ctype, payload = self._record()
            except TLSAlert as alert:
                if alert.description == 0:
                    return b""
                raise
            except ConnectionError:
                return b""
            if ctype == 0x17:
                return payload
            # post-handshake messages (NewSessionTicket): nothing to do with them here

    def request(self, raw: bytes) -> bytes:
        """Send an HTTP/1.1 request and read until the head and a Content-Length body are in."""
        self.send(raw)
        out = b""
        while True:
            chunk = self.recv()
            if not chunk:
                return out
            out += chunk
            head, sep, body = out.partition(b"\r\n\r\n")
            if sep:
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length" and len(body) >= int(value):
                        return out
