"""Opt-in redaction of secrets before a message is stored.

Agents paste keys, tokens and passwords into chats and tool calls; a lossless
store would otherwise keep them forever (and in every payload file and
backup). With ``TROVE_SENSITIVE_PATTERNS_ENABLED`` the engine runs each
message through a ``Redactor`` before guarding and encoding it.

Placeholders:
- ``[REDACTED:<name>:sha256=<8 hex>]``: the first 8 hex digits of the secret's
  SHA-256, so two mentions of one key can be correlated without revealing it;
- ``[REDACTED:password]`` for passwords: no hash, short passwords would be
  brute-forced from it.
Only the secret is replaced; the syntax around it (``password=``, the quotes,
``Authorization: Bearer ``) stays. Text inside existing placeholders is never
matched again, so redacting twice changes nothing.

Every pattern is linear-time: no nested unbounded quantifiers, and each
unbounded character run starts right after a literal or a look-behind that
only passes at the start of a run. Detection is deliberately conservative:
generic values must contain a letter and a digit, so prose and code like
``api_key = os.environ[...]`` stay readable. An unquoted password ends at
whitespace or a delimiter (``,;&<>()[]{}``), so ``passwd: correct horse``
keeps ``horse``; quoted values are replaced whole.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from typing import Callable, Sequence

PASSWORD_PLACEHOLDER = "[REDACTED:password]"
PLACEHOLDER_FORMAT = "[REDACTED:<pattern name>:sha256=<first 8 hex digits of the secret's SHA-256>]"
_PLACEHOLDER_RE = re.compile(r"\[REDACTED:[a-z_]{1,32}(?::sha256=[0-9a-f]{8})?\]")
# A PEM block longer than this is treated as truncated (real keys are < 8 KB).
MAX_PEM_CHARS = 64 * 1024
# Values that name a secret instead of being one (``$PASSWORD``, ``<password>``, ``***``).
_REFERENCE_VALUE_RE = re.compile(r"[$<{%]|\*+$|(?i:null|none|true|false)$")
_TOKEN = r"[A-Za-z0-9_.~+/-]"


def _hash8(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _letter_and_digit(value: str) -> bool:
    return bool(re.search(r"[0-9]", value)) and bool(re.search(r"[A-Za-z]", value))


def _not_a_reference(value: str) -> bool:
    return _REFERENCE_VALUE_RE.match(value) is None


class _Anchored:
    """A detector that can only match where one of its anchors occurs: ``exact``
    literals as written, ``folded`` (lower-case ASCII) in any letter case, as the
    case-insensitive part of its regex matches them. Texts without any anchor are
    not scanned by its regex at all (most texts, for most detectors)."""

    exact: tuple[str, ...] = ()
    folded: tuple[str, ...] = ()
    _folded_re: re.Pattern | None = None

    def _anchor(self, exact: Sequence[str], folded: Sequence[str]) -> None:
        self.exact, self.folded = tuple(exact), tuple(folded)
        self._folded_re = (re.compile("(?i:" + "|".join(map(re.escape, folded)) + ")")
                           if folded else None)

    def may_match(self, text: str, lowered: str | None) -> bool:
        """Whether an anchor occurs in ``text``; ``lowered`` is ``text.lower()`` for an
        ASCII text (where it folds case exactly as the regex engine does), else None
        (then the regex engine itself looks for the folded anchors)."""
        for literal in self.exact:
            if literal in text:
                return True
        if not self.folded:
            return False
        if lowered is None:
            return self._folded_re.search(text) is not None
        for literal in self.folded:
            if literal in lowered:
                return True
        return False


class _Rule(_Anchored):
    """One regex whose named groups (the first one that matched) hold the secret;
    ``entry`` names it in the catalog and ``doc`` says what it finds. Every match
    contains one of the ``exact`` or (any case) ``folded`` anchors."""

    def __init__(self, pattern: str, *, label: str, entry: str, doc: str,
                 exact: Sequence[str] = (), folded: Sequence[str] = (),
                 groups: Sequence[str] = ("secret",),
                 check: Callable[[str], bool] | None = None, hashed: bool = True):
        self.regex = re.compile(pattern)
        self.label, self.groups, self.check, self.hashed = label, tuple(groups), check, hashed
        self.entry, self.doc = entry, doc
        self._anchor(exact, folded)

    def placeholder(self, secret: str) -> str:
        return f"[REDACTED:{self.label}:sha256={_hash8(secret)}]" if self.hashed \
            else f"[REDACTED:{self.label}]"

    def apply(self, text: str) -> tuple[str, int]:
        count = 0

        def replace(match: re.Match) -> str:
            nonlocal count
            group = next(g for g in self.groups if match.group(g) is not None)
            secret = match.group(group)
            if self.check is not None and not self.check(secret):
                return match.group(0)
            count += 1
            start, end = match.start(group) - match.start(), match.end(group) - match.start()
            whole = match.group(0)
            return whole[:start] + self.placeholder(secret) + whole[end:]

        return self.regex.sub(replace, text), count


class _PemRule(_Anchored):
    """PEM private key blocks, BEGIN to the matching END (or to the end of a truncated body)."""

    entry = "pem_private_key"
    exact = ("-----BEGIN ",)
    doc = "PEM private key blocks (RSA, EC, OPENSSH, ENCRYPTED ...), BEGIN to END"

    begin = re.compile(r"-----BEGIN (?P<label>[A-Z0-9]{1,20}(?: [A-Z0-9]{1,20}){0,3} )?"
                       r"PRIVATE KEY(?P<block> BLOCK)?-----")
    # Lines after BEGIN that look like key material or PEM headers (real or escaped newlines).
    body = re.compile(r"(?:(?:\r?\n|\\r\\n|\\n)"
                      r"(?:[A-Za-z0-9+/=]{1,100}|[A-Za-z][A-Za-z-]{0,30}: [^\r\n\\]{0,200})?"
                      r"(?=\r|\n|\\[rn]|$))*")

    end = re.compile(r"-----END (?:[A-Z0-9]{1,20}(?: [A-Z0-9]{1,20}){0,3} )?"
                     r"PRIVATE KEY(?: BLOCK)?-----")

    def apply(self, text: str) -> tuple[str, int]:
        out, pos, count = [], 0, 0
        footers: dict[str, list[int]] | None = None
        for match in self.begin.finditer(text):
            if match.start() < pos:
                continue
            if footers is None:  # one pass over the text, only when a key is present
                footers = {}
                for end in self.end.finditer(text):
                    footers.setdefault(end.group(0), []).append(end.start())
            end = self._block_end(text, match, footers)
            block = text[match.start():end]
            out.append(text[pos:match.start()])
            out.append(f"[REDACTED:private_key:sha256={_hash8(block)}]")
            pos, count = end, count + 1
        out.append(text[pos:])
        return "".join(out), count

    def _block_end(self, text: str, match: re.Match, footers: dict[str, list[int]]) -> int:
        """Where the block that starts at ``match`` ends: after its footer, or after its body."""
        label = match.group("label") or ""
        footer = f"-----END {label}PRIVATE KEY{match.group('block') or ''}-----"
        starts = footers.get(footer, [])
        index = bisect.bisect_left(starts, match.end())
        if index < len(starts) and starts[index] - match.start() <= MAX_PEM_CHARS:
            return starts[index] + len(footer)
        return self.body.match(text, match.end()).end()


def _mixed(value: str) -> bool:
    """Looks generated: a letter and a digit, or upper and lower case letters."""
    return _letter_and_digit(value) or (bool(re.search(r"[a-z]", value))
                                        and bool(re.search(r"[A-Z]", value)))


def _secretish(value: str) -> bool:
    """A value that looks generated, not a name in code (``settings.SECRET_KEY``)."""
    return _letter_and_digit(value) or (len(value) >= 20 and "." not in value
                                        and _mixed(value))


_PASSWORD_VALUE = (r"(?:\\\"(?P<edq>[^\"\\\r\n]{1,256})\\\""
                   r"|\"(?P<dq>(?:[^\"\\\r\n]|\\.){1,256})\"|'(?P<sq>(?:[^'\\\r\n]|\\.){1,256})'"
                   r"|(?P<bare>[^\s\"'\\,;&<>(){}\[\]]{1,256}))")
_PASSWORD_GROUPS = ("edq", "dq", "sq", "bare")
_TOKEN_KINDS = ("access", "refresh", "auth", "api", "private", "session", "id")


def _spellings(*words: str) -> tuple[str, ...]:
    """``words`` joined by nothing, ``_`` or ``-`` between each pair, as ``[_-]?`` allows
    (the anchors of a detector that matches such a name)."""
    out = [words[0]]
    for word in words[1:]:
        out = [f"{head}{sep}{word}" for head in out for sep in ("", "_", "-")]
    return tuple(out)
_ASSIGN = r"[\"']?[ \t]*[:=][ \t]*[\"']?"

_RULES: dict[str, tuple] = {
    "private_key": (_PemRule(),),
    "api_key": (
        _Rule(r"(?<![A-Za-z0-9_-])(?P<secret>sk-[A-Za-z0-9_-]{20,})", label="api_key",
              entry="openai_style_key", doc="sk-... keys (OpenAI, Anthropic sk-ant-, DeepSeek "
              "and other OpenAI-compatible providers), bare or assigned",
              check=lambda s: _letter_and_digit(s[3:]), exact=("sk-",)),
        _Rule(r"(?<![A-Za-z0-9])(?P<secret>(?:AKIA|ASIA)[0-9A-Z]{16})(?![A-Za-z0-9])",
              label="api_key", entry="aws_access_key_id", doc="AWS access key ids AKIA/ASIA...",
              exact=("AKIA", "ASIA")),
        _Rule(r"(?<![A-Za-z0-9_])(?P<secret>gh[pousr]_[A-Za-z0-9]{36,}"
              r"|github_pat_[A-Za-z0-9_]{22,})", label="api_key", entry="github_token",
              doc="GitHub tokens ghp_/gho_/ghu_/ghs_/ghr_ and github_pat_",
              exact=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")),
        _Rule(r"(?<![A-Za-z0-9-])(?P<secret>(?:xox[abposre]|xapp)-[A-Za-z0-9-]{10,})",
              label="api_key", entry="slack_token",
              doc="Slack bot/user/app tokens xoxb-, xoxp-, xoxe-, xapp-", check=_letter_and_digit,
              exact=tuple(f"xox{c}-" for c in "abposre") + ("xapp-",)),
        _Rule(r"(?<![A-Za-z0-9_-])(?P<secret>AIza[0-9A-Za-z_-]{35})(?![A-Za-z0-9_-])",
              label="api_key", entry="google_api_key", doc="Google API keys AIza...",
              exact=("AIza",)),
        _Rule(r"(?<![A-Za-z0-9_])(?P<secret>[sr]k_(?:live|test)_[A-Za-z0-9]{16,})",
              label="api_key", entry="stripe_key",
              doc="Stripe secret and restricted keys sk_live_, rk_live_ (and _test_)",
              exact=("k_live_", "k_test_")),
        _Rule(r"(?<![A-Za-z0-9_])(?P<secret>hf_[A-Za-z0-9]{30,})(?![A-Za-z0-9_])",
              label="api_key", entry="huggingface_token", doc="Hugging Face tokens hf_...",
              check=lambda s: _mixed(s[3:]), exact=("hf_",)),
        _Rule(r"(?<![A-Za-z0-9_.-])(?P<secret>SG\.[A-Za-z0-9_-]{16,32}\.[A-Za-z0-9_-]{16,64})"
              r"(?![A-Za-z0-9_-])", label="api_key", entry="sendgrid_key",
              doc="SendGrid API keys SG.<id>.<secret>", exact=("SG.",)),
        _Rule(r"(?<![A-Za-z0-9])(?P<secret>SK[0-9a-f]{32})(?![A-Za-z0-9])", label="api_key",
              entry="twilio_api_key", doc="Twilio API key SIDs SK + 32 hex digits",
              exact=("SK",)),
        _Rule(r"(?<![A-Za-z0-9_])(?P<secret>npm_[A-Za-z0-9]{36})(?![A-Za-z0-9])",
              label="api_key", entry="npm_token", doc="npm access tokens npm_...",
              exact=("npm_",)),
        _Rule(r"(?i)(?<![A-Za-z0-9])(?:x-)?api[_-]?key" + _ASSIGN +
              rf"(?P<secret>{_TOKEN}{{8,}})", label="api_key", entry="api_key_assignment",
              doc="api_key=, apiKey:, X-API-Key: values with a letter and a digit",
              check=_letter_and_digit, folded=("apikey", "api_key", "api-key")),
    ),
    "bearer_token": (
        _Rule(r"(?i)(?<![A-Za-z0-9-])authorization[\"']?[ \t]*[:=][ \t]*[\"']?"
              rf"(?:bearer|basic|token|digest)[ \t]+(?P<secret>{_TOKEN}{{8,}}=*)",
              label="bearer_token", entry="authorization_header",
              doc="Authorization: Bearer/Basic/Token/Digest credentials",
              folded=("authorization",)),
        _Rule(rf"(?<![A-Za-z0-9])(?i:bearer)[ \t]+(?P<secret>{_TOKEN}{{16,}}=*)",
              label="bearer_token", entry="bearer_value", doc="Bearer <token> anywhere",
              check=_letter_and_digit, folded=("bearer",)),
        _Rule(r"(?<![A-Za-z0-9_-])(?P<secret>eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\."
              r"[A-Za-z0-9_-]*)", label="bearer_token", entry="jwt",
              doc="bare JSON Web Tokens eyJ...eyJ... (cookies, query strings, JSON, logs)",
              exact=("eyJ",)),
    ),
    "password_assignment": (
        _Rule(r"(?i:pass(?:word|wd|phrase))\\?" + r"[\"']?[ \t]*[:=][ \t]*" + _PASSWORD_VALUE,
              label="password", entry="password_assignment", groups=_PASSWORD_GROUPS,
              doc="password=, passwd:, \"passphrase\": values (quoted values whole)",
              check=_not_a_reference, hashed=False, folded=("password", "passwd", "passphrase")),
        _Rule(r"(?<=_)(?i:pass|pwd)(?![A-Za-z0-9])\\?" + r"[\"']?[ \t]*[:=][ \t]*"
              + _PASSWORD_VALUE, label="password", entry="env_password",
              doc="environment-style DB_PASS=, SMTP_PWD: values", groups=_PASSWORD_GROUPS,
              check=_not_a_reference, hashed=False, folded=("_pass", "_pwd")),
        _Rule(r"(?<![A-Za-z0-9_-])(?:mysql|mysqldump|mysqladmin|mariadb)"
              r"(?:[ \t]+[^\s]{1,200}){0,12}?[ \t]+-p(?:'(?P<sq>[^'\r\n]{1,256})'"
              r"|\"(?P<dq>[^\"\r\n]{1,256})\"|(?P<bare>[^\s\"'\\;&|<>]{1,256}))",
              label="password", entry="mysql_cli_password", groups=("sq", "dq", "bare"),
              doc="mysql/mysqldump/mariadb -p<password> on a command line",
              check=_not_a_reference, hashed=False, exact=("mysql", "mariadb")),
        _Rule(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}://"
              r"[^\s:/@?#\[\]\"'\\]{0,256}:(?P<secret>[^\s/@?#\"'\\]{1,256})@",
              label="password", entry="url_userinfo",
              doc="user:password@ in URLs (database DSNs, git remotes, image URLs)",
              hashed=False, exact=("://",)),
    ),
    "secret_assignment": (
        _Rule(r"(?i)(?<![A-Za-z0-9])(?:aws[_-]?)?secret[_-]?access[_-]?key" + _ASSIGN +
              r"(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])", label="secret",
              entry="aws_secret_access_key",
              doc="AWS secret access keys (aws_secret_access_key, SecretAccessKey)",
              folded=_spellings("secret", "access", "key")),
        _Rule(r"(?i)(?<![A-Za-z0-9])(?:client[_-]?secret|secret(?:[_-]?key)?"
              r"|(?:access|refresh|auth|api|private|session|id)[_-]?token)" + _ASSIGN +
              rf"(?P<secret>{_TOKEN}{{8,}})", label="secret", entry="secret_assignment",
              doc="SECRET_KEY=, client_secret=, \"access_token\":, _authToken= (npmrc), "
              "refresh_token ... values that look generated", check=_secretish,
              folded=("secret",) + tuple(spelling for word in _TOKEN_KINDS
                                         for spelling in _spellings(word, "token"))),
    ),
    "webhook_url": (
        _Rule(r"(?i)hooks\.slack\.com/(?:services|workflows|triggers)/"
              r"(?P<secret>[A-Za-z0-9_/-]{20,})", label="webhook_url", entry="slack_webhook",
              doc="Slack incoming-webhook URLs hooks.slack.com/services/...",
              folded=("hooks.slack.com/",)),
        _Rule(r"(?i)discord(?:app)?\.com/api/webhooks/(?P<secret>[0-9]{5,30}/[A-Za-z0-9_-]{20,})",
              label="webhook_url", entry="discord_webhook",
              doc="Discord webhook URLs discord.com/api/webhooks/<id>/<token>",
              folded=("discord",)),
    ),
}
KNOWN_NAMES = tuple(_RULES)  # also the order in which enabled patterns run
# Every named detector: (family name in TROVE_SENSITIVE_PATTERNS, entry, what it finds).
CATALOG = tuple((family, rule.entry, rule.doc) for family, rules in _RULES.items()
                for rule in rules)
# Strings never scanned: the keys that identify a message or part, and opaque provider
# blobs that must go back byte-exact (a signed thinking block, encrypted reasoning, base64
# media); inline ``data:`` URLs are skipped too.
UNSCANNED_KEYS = frozenset({"role", "id", "type", "tool_call_id", "name", "tool_name",
                            "signature", "encrypted_content", "data"})


def _outside_placeholders(text: str, rule) -> tuple[str, int]:
    """Apply ``rule`` to the text between existing placeholders only (idempotence)."""
    if "[REDACTED:" not in text:  # no placeholder: the whole text is one piece
        return rule.apply(text)
    pieces, pos, total = [], 0, 0
    for match in _PLACEHOLDER_RE.finditer(text):
        redacted, count = rule.apply(text[pos:match.start()])
        pieces += [redacted, match.group(0)]
        pos, total = match.end(), total + count
    redacted, count = rule.apply(text[pos:])
    pieces.append(redacted)
    return "".join(pieces), total + count


class Redactor:
    """The enabled secret detectors, applied in a fixed order to text and messages."""

    def __init__(self, names: Sequence[str]):
        wanted = [n.strip().lower() for n in names if n and n.strip()]
        self.enabled_names = tuple(n for n in KNOWN_NAMES if n in wanted)
        self.unknown = tuple(dict.fromkeys(n for n in wanted if n not in _RULES))

    @property
    def enabled(self) -> bool:
        """Whether any detector is on (an all-unknown list redacts nothing)."""
        return bool(self.enabled_names)

    def redact(self, text: str) -> tuple[str, int]:
        """``text`` with every detected secret replaced, and how many were replaced.

        A detector runs only when one of its anchors occurs in the text as given:
        the pieces it scans (between placeholders, after earlier detectors replaced
        secrets) are all pieces of that text, so a detector without an anchor there
        cannot match (the result is the same as running every detector)."""
        total, original = 0, text
        lowered = text.lower() if text.isascii() else None
        for name in self.enabled_names:
            for rule in _RULES[name]:
                if rule.may_match(original, lowered):
                    text, count = _outside_placeholders(text, rule)
                    total += count
        return text, total

    def redact_message(self, message: dict) -> tuple[dict, int]:
        """A new message with secrets redacted in every string field, however nested.

        Content and its parts, ``reasoning``/``reasoning_details``, ``refusal``,
        tool-call arguments (a JSON string or an object), image URLs, tool results:
        a secret can hide in any of them. Only identifying keys and opaque provider blobs
        (``UNSCANNED_KEYS``: role, ids, types, names, signature, encrypted_content, data)
        and inline ``data:`` URLs are left as they are.
        The input is not changed.
        """
        return self._walk(message)

    def _walk(self, value):
        """``value`` with every scannable string redacted, and the count."""
        if isinstance(value, str):
            return (value, 0) if value.startswith("data:") else self.redact(value)
        if isinstance(value, list):
            out, total = [], 0
            for item in value:
                item, count = self._walk(item)
                out.append(item)
                total += count
            return out, total
        if isinstance(value, dict):
            out, total = {}, 0
            for key, item in value.items():
                if key not in UNSCANNED_KEYS:
                    item, count = self._walk(item)
                    total += count
                out[key] = item
            return out, total
        return value, 0

    def describe(self) -> dict:
        """The redaction contract for status output: names and placeholder formats, no secrets."""
        return {"enabled": list(self.enabled_names), "unknown": list(self.unknown),
                "known": list(KNOWN_NAMES),
                "catalog": {f: [e for fam, e, _ in CATALOG if fam == f] for f in KNOWN_NAMES}, "placeholder": PLACEHOLDER_FORMAT,
                "password_placeholder": PASSWORD_PLACEHOLDER}


def configured(config) -> "Redactor | None":
    """The redactor the settings ask for (TROVE_SENSITIVE_PATTERNS_ENABLED with
    TROVE_SENSITIVE_PATTERNS), else None: one rule for ingest, imports and the embedding
    side, so each redacts exactly what the others do."""
    return Redactor(config.sensitive_patterns) if config.sensitive_patterns_enabled else None


def redact_for(config):
    """``Redactor.redact`` of the configured redactor, else None: what the embedding side
    is handed (``recall.semantic.outgoing``), which sits beside ingest and may not
    import it."""
    redactor = configured(config)
    return None if redactor is None else redactor.redact
