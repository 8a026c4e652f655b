"""redaction.py: each detector's positives and near misses, placeholders, idempotence, messages."""
import copy
import hashlib
import json
import re
import time
from pathlib import Path

import pytest

from hermes_trove import config
from hermes_trove.ingest.redaction import KNOWN_NAMES, PASSWORD_PLACEHOLDER, Redactor

ALL = Redactor(list(KNOWN_NAMES))
PLACEHOLDER = re.compile(r"\[REDACTED:[a-z_]+(?::sha256=[0-9a-f]{8})?\]")


def h8(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()[:8]


def redacted(text: str, names=KNOWN_NAMES) -> str:
    out, count = Redactor(list(names)).redact(text)
    assert count == len(PLACEHOLDER.findall(out)) - len(PLACEHOLDER.findall(text))
    return out


def test_known_names_match_the_config():
    assert set(KNOWN_NAMES) == config.KNOWN_SENSITIVE_PATTERNS


# ---------------------------------------------------------------- api_key
OPENAI = "sk-proj-Ab3dEfGh1jKlMnOpQrStUvWxYz0123456789"
ANTHROPIC = "sk-ant-api03-AbCdEf0123456789_xyzXYZ-abcdefghijKLMNOP"
AWS = "AKIAIOSFODNN7EXAMPLE"
GITHUB = "ghp_0123456789abcdefghijABCDEFGHIJ012345"
SLACK = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"


@pytest.mark.parametrize("text,secret", [
    (f"export OPENAI_API_KEY={OPENAI}", OPENAI),
    (f'client = Anthropic(api_key="{ANTHROPIC}")', ANTHROPIC),
    (f"legacy key: sk-{'A1b2C3d4' * 6}", f"sk-{'A1b2C3d4' * 6}"),
    (f"aws_access_key_id = {AWS}", AWS),
    (f"git remote set-url origin https://{GITHUB}@github.com/o/r", GITHUB),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
     "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"),
    (f"SLACK_TOKEN={SLACK}", SLACK),
    ("xoxp-1234-5678-abcdefgh", "xoxp-1234-5678-abcdefgh"),
    ("maps key AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW", "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW"),
    ('{"api_key": "a1b2c3d4e5f6g7h8"}', "a1b2c3d4e5f6g7h8"),
    ("X-API-Key: 9f8e7d6c5b4a3210zz", "9f8e7d6c5b4a3210zz"),
    ("APIKEY=Zx81Qp07Lm52Ty", "Zx81Qp07Lm52Ty"),
])
def test_api_key_positives(text, secret):
    out = redacted(text, ["api_key"])
    assert secret not in out
    assert f"[REDACTED:api_key:sha256={h8(secret)}]" in out
    assert out == text.replace(secret, f"[REDACTED:api_key:sha256={h8(secret)}]")


@pytest.mark.parametrize("text", [
    "sk-abc123",                                       # too short
    "use scikit-learn: sk-learn-compatible-estimators-everywhere",  # no digit
    "risk-0123456789abcdefghijklmnop",                 # 'sk-' inside a word
    "commit 3f2a9c8e1b7d6f5a4c3b2a1908f7e6d5c4b3a291",   # a git sha
    "AKIA1234",                                        # too short for AWS
    "ghp_short",
    "api_key: YOUR_API_KEY_HERE",                      # placeholder, no digit
    "api_key = os.environ['OPENAI_API_KEY']",
    "the api key is in the vault",
    "xoxb-not-a-token-at-all",
])
def test_api_key_near_misses(text):
    assert redacted(text, ["api_key"]) == text


# ---------------------------------------------------------------- bearer_token
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk"


@pytest.mark.parametrize("text,secret", [
    (f"Authorization: Bearer {JWT}", JWT),
    (f"curl -H 'Authorization: Bearer {JWT}' https://api", JWT),
    (f'{{"headers": {{"Authorization": "Bearer {JWT}"}}}}', JWT),
    ("authorization=bearer abcdefghijklmnopqrstuvwx", "abcdefghijklmnopqrstuvwx"),
    ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
    ("Authorization: token 1a2b3c4d5e6f7a8b", "1a2b3c4d5e6f7a8b"),
    ("then send Bearer 0123456789abcdefXYZ== as the header", "0123456789abcdefXYZ=="),
])
def test_bearer_token_positives(text, secret):
    out = redacted(text, ["bearer_token"])
    assert secret not in out
    assert out == text.replace(secret, f"[REDACTED:bearer_token:sha256={h8(secret)}]")


@pytest.mark.parametrize("text", [
    "Bearer of bad news",
    "the bearer tokenizationisgreatstuff",             # no digit, no Authorization header
    "Bearer abc123",                                   # too short
    "Authorization: required",
    "an authorization header with a bearer token goes here",
])
def test_bearer_token_near_misses(text):
    assert redacted(text, ["bearer_token"]) == text


# ---------------------------------------------------------------- password_assignment
@pytest.mark.parametrize("text,expected", [
    ("password=hunter2", "password=[REDACTED:password]"),
    ("DB_PASSWORD=s3cr3t!", "DB_PASSWORD=[REDACTED:password]"),
    ("passwd: correct horse", "passwd: [REDACTED:password] horse"),  # unquoted ends at a space
    ('passwd: "correct horse"', 'passwd: "[REDACTED:password]"'),
    ('{"password": "hun\\"ter2", "user": "bob"}',
     '{"password": "[REDACTED:password]", "user": "bob"}'),
    ("conn(password='pa ss', host='h')", "conn(password='[REDACTED:password]', host='h')"),
    ("mysql --password=Tr0ub4dor3 -u root", "mysql --password=[REDACTED:password] -u root"),
    ("Passphrase: abc", "Passphrase: [REDACTED:password]"),
    ("postgres://bob:Sup3r$ecret@db.example:5432/app",
     "postgres://bob:[REDACTED:password]@db.example:5432/app"),
    ("redis://:onlypass@cache:6379", "redis://:[REDACTED:password]@cache:6379"),
    ("https://h/login?user=bob&password=hunter2&next=/",
     "https://h/login?user=bob&password=[REDACTED:password]&next=/"),
    ("https://alice:p%40ss@example.com/x", "https://alice:[REDACTED:password]@example.com/x"),
    ('{"cmd": "psql \\"password=hunter2\\""}',
     '{"cmd": "psql \\"password=[REDACTED:password]\\""}'),
    ('{"args": "{\\"password\\": \\"hunter2\\"}"}',
     '{"args": "{\\"password\\": \\"[REDACTED:password]\\"}"}'),
])
def test_password_positives_keep_the_syntax(text, expected):
    assert redacted(text, ["password_assignment"]) == expected


@pytest.mark.parametrize("text", [
    "Please reset your password and try again.",
    "Forgot password?",
    "Enter your password:\n",
    "password: $DB_PASSWORD",
    'password = ""',
    "password: <your password>",
    "password=********",
    "password_reset_url=https://example.com/reset",
    "the passwords: are stored hashed",
    "http://example.com:8080/path",
    "ssh git@github.com:org/repo.git",
])
def test_password_near_misses(text):
    assert redacted(text, ["password_assignment"]) == text


def test_password_placeholder_carries_no_hash():
    out = redacted("password=a", ["password_assignment"])
    assert out == f"password={PASSWORD_PLACEHOLDER}" and "sha256" not in out


def test_tool_call_json_stays_valid_after_redaction():
    args = json.dumps({"password": 'pa"ss\\word', "url": "postgres://u:p4ss@h/db",
                       "auth": f"Bearer {JWT}", "key": OPENAI})
    out = redacted(args)
    parsed = json.loads(out)
    assert parsed["password"] == PASSWORD_PLACEHOLDER
    assert parsed["url"] == f"postgres://u:{PASSWORD_PLACEHOLDER}@h/db"
    assert OPENAI not in out and JWT not in out


# ---------------------------------------------------------------- private_key
RSA = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx1b2c3d4e5f6\n"
       "Proc-Type: 4,ENCRYPTED\nabcdEFGH0123+/==\n-----END RSA PRIVATE KEY-----")
PKCS8 = "-----BEGIN PRIVATE KEY-----\r\nMIIEvQIBADANBgkqhkiG9w0BAQEF\r\n-----END PRIVATE KEY-----"
OPENSSH = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU\n"
           "-----END OPENSSH PRIVATE KEY-----")
PGP = "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF0\n-----END PGP PRIVATE KEY BLOCK-----"


@pytest.mark.parametrize("key", [RSA, PKCS8, OPENSSH, PGP])
def test_private_key_blocks_are_replaced_whole(key):
    text = f"cat id_rsa\n{key}\n$ next command"
    out = redacted(text, ["private_key"])
    assert out == f"cat id_rsa\n[REDACTED:private_key:sha256={h8(key)}]\n$ next command"


def test_private_key_inside_json_string():
    args = json.dumps({"content": RSA, "path": "/tmp/k"})
    out = redacted(args, ["private_key"])
    escaped_key = json.dumps(RSA)[1:-1]  # the block as it appears inside the JSON text
    assert json.loads(out) == {"content": f"[REDACTED:private_key:sha256={h8(escaped_key)}]",
                               "path": "/tmp/k"}


def test_truncated_private_key_is_redacted_up_to_the_end_of_its_body():
    text = "$ head -3 key.pem\n-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBk9\nAwEHoUQDQgAE\nDone."
    out = redacted(text, ["private_key"])
    assert out.startswith("$ head -3 key.pem\n[REDACTED:private_key:sha256=")
    assert out.endswith("]\nDone.") and "MHcC" not in out and "AwEH" not in out


@pytest.mark.parametrize("text", [
    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkq\n-----END PUBLIC KEY-----",
    "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+g\n-----END CERTIFICATE-----",
    "-----BEGIN OPENSSH PUBLIC KEY-----",
    "we never paste a PRIVATE KEY into chat",
])
def test_private_key_near_misses(text):
    assert redacted(text, ["private_key"]) == text


# ---------------------------------------------------------------- the Redactor
def test_hashes_are_stable_and_correlate_mentions():
    text = f"first {OPENAI} then again {OPENAI} and {AWS}"
    out, count = ALL.redact(text)
    assert count == 3
    tag = f"[REDACTED:api_key:sha256={h8(OPENAI)}]"
    assert out.count(tag) == 2 and ALL.redact(text)[0] == out
    assert Redactor(["api_key"]).redact(text)[0] == out


@pytest.mark.parametrize("text", [
    f"key={OPENAI} password=x Authorization: Bearer {JWT} {RSA} postgres://a:b@h",
    "api_key: [REDACTED:api_key:sha256=1a2b3c4d] password=[REDACTED:password]",
    "[REDACTED:private_key:sha256=00000000]",
])
def test_redaction_is_idempotent(text):
    once, _ = ALL.redact(text)
    assert ALL.redact(once) == (once, 0)


def test_names_unknown_and_disabled():
    redactor = Redactor([" api_key ", "Password_Assignment", "credit_card", "", "credit_card"])
    assert redactor.enabled_names == ("api_key", "password_assignment")
    assert redactor.unknown == ("credit_card",)
    assert redactor.enabled
    nothing = Redactor(["credit_card"])
    assert not nothing.enabled and nothing.redact(f"password={OPENAI}") == (f"password={OPENAI}", 0)


def test_describe_never_contains_a_secret():
    redactor = Redactor(["api_key", "bogus"])
    redactor.redact(f"key {OPENAI}")
    info = redactor.describe()
    assert info["enabled"] == ["api_key"] and info["unknown"] == ["bogus"]
    assert info["password_placeholder"] == "[REDACTED:password]"
    assert "sha256" in info["placeholder"] and OPENAI not in json.dumps(info)


def test_redact_message_covers_content_parts_tool_calls_and_results():
    assistant = {"role": "assistant", "content": [
        {"type": "text", "text": f"using {OPENAI}"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,password=abc"}}],
        "reasoning": "the password=hunter2 from the note",
        "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "terminal", "arguments": json.dumps({"cmd": f"export KEY={AWS}"})}}]}
    before = copy.deepcopy(assistant)
    out, count = ALL.redact_message(assistant)
    assert assistant == before
    assert count == 3
    assert OPENAI not in json.dumps(out) and AWS not in json.dumps(out)
    assert out["reasoning"] == f"the password={PASSWORD_PLACEHOLDER} from the note"
    assert out["content"][1] == assistant["content"][1]  # inline data URLs are not scanned
    assert json.loads(out["tool_calls"][0]["function"]["arguments"])["cmd"].startswith(
        "export KEY=[REDACTED:api_key:")
    tool = {"role": "tool", "tool_call_id": "c1", "content": f"{RSA}\nok"}
    out, count = ALL.redact_message(tool)
    assert count == 1 and out["content"].endswith("]\nok") and out["tool_call_id"] == "c1"
    nested = {"role": "user", "content": [{"type": "tool_result", "content": [
        {"type": "text", "text": "password=x"}]}]}
    assert ALL.redact_message(nested)[0]["content"][0]["content"][0]["text"] == \
        f"password={PASSWORD_PLACEHOLDER}"
    plain = {"role": "user", "content": None}
    assert ALL.redact_message(plain) == (plain, 0)


@pytest.mark.parametrize("hostile", [
    "a" * 200_000, "sk-" * 70_000, "password=" * 25_000, "a://" * 50_000,
    "-----BEGIN PRIVATE KEY-----" * 8_000, "Bearer " * 30_000, "api_key=" * 25_000,
    "http://" + "a" * 100_000 + ":" + "b" * 100_000,
    'password="' + "\\a" * 100_000,
    "mysql " * 30_000, "mysql -x" + " -q" * 50_000, "eyJaaaaa." * 20_000, "_pass=" * 30_000,
    "secret=" * 25_000, "hooks.slack.com/services/" * 8_000, "SG." * 60_000,
])
def test_patterns_stay_linear_on_hostile_input(hostile):
    started = time.perf_counter()
    ALL.redact(hostile)
    assert time.perf_counter() - started < 2.0


# ---------------------------------------------------------------- the catalog
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkFuYSJ9."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
STRIPE = "sk_live_51HcDeFgHiJkLmNoPqRsTuVwXy"
HF = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
SENDGRID = "SG.AbCdEfGhIjKlMnOpQrStUv.0123456789abcdefghijABCDEFGHIJ_-0123456789x"
TWILIO = "SK0123456789abcdef0123456789abcdef"
NPM = "npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
SLACK_HOOK = "T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"


@pytest.mark.parametrize("text,secret,label", [
    (f"token {JWT} expires", JWT, "bearer_token"),
    (f"Cookie: session={JWT}; theme=dark", JWT, "bearer_token"),
    (f'{{"id_token": "{JWT}"}}', JWT, "bearer_token"),
    (f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET, "secret"),
    (f'"SecretAccessKey": "{AWS_SECRET}",', AWS_SECRET, "secret"),
    (f"stripe.api_key = '{STRIPE}'", STRIPE, "api_key"),
    ("STRIPE_RK=rk_live_51HcDeFgHiJkLmNoPqRsTuV", "rk_live_51HcDeFgHiJkLmNoPqRsTuV", "api_key"),
    ("SECRET_KEY=django-insecure-8f3k2j1h0g9f", "django-insecure-8f3k2j1h0g9f", "secret"),
    ("client_secret=Q7w8E9r0T1y2U3i4", "Q7w8E9r0T1y2U3i4", "secret"),
    ('{"access_token": "ya29.a0AfH6SMBx3y7"}', "ya29.a0AfH6SMBx3y7", "secret"),
    (f"//registry.npmjs.org/:_authToken={NPM}", NPM, "api_key"),
    ("//npm.example/:_authToken=0f3c9a7e-1b2d-4c5e-8f9a-0b1c2d3e4f5a",
     "0f3c9a7e-1b2d-4c5e-8f9a-0b1c2d3e4f5a", "secret"),
    (f"HF_TOKEN={HF}", HF, "api_key"),
    (f"sendgrid key {SENDGRID}", SENDGRID, "api_key"),
    (f"twilio {TWILIO}", TWILIO, "api_key"),
    ("SLACK_APP_TOKEN=xapp-1-A0123456789-1234567890123-abcdef0123456789",
     "xapp-1-A0123456789-1234567890123-abcdef0123456789", "api_key"),
    (f"curl -X POST https://hooks.slack.com/services/{SLACK_HOOK} -d '{{}}'", SLACK_HOOK,
     "webhook_url"),
    ("https://discord.com/api/webhooks/123456789012345678/AbCdEfGhIjKlMnOpQrStUvWxYz012345",
     "123456789012345678/AbCdEfGhIjKlMnOpQrStUvWxYz012345", "webhook_url"),
    ("key sk-a3f9c2e1b4d5a6f7e8d9c0b1a2f3e4d5", "sk-a3f9c2e1b4d5a6f7e8d9c0b1a2f3e4d5", "api_key"),
    ("OPENAI_KEY:sk-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKl",
     "sk-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKl", "api_key"),
])
def test_catalog_positives(text, secret, label):
    out = redacted(text)
    assert secret not in out and f"[REDACTED:{label}:sha256={h8(secret)}]" in out


@pytest.mark.parametrize("text,secret", [
    ("DB_PASS=hunter2", "hunter2"),
    ("export SMTP_PASS='correct horse'", "correct horse"),
    ("mysql -u root -pS3cr3t! -h db.internal app", "S3cr3t!"),
    ("mysqldump -uadmin -p'p@ss word' shop > dump.sql", "p@ss word"),
])
def test_catalog_password_positives(text, secret):
    out = redacted(text)
    assert secret not in out and PASSWORD_PLACEHOLDER in out


@pytest.mark.parametrize("text", [
    "eyJhbGciOiJIUzI1NiJ9 is only a header",
    "SECRET_KEY = settings.SECRET_KEY",
    "client_secret=client_secret",
    'access_token = response.json()["access_token"]',
    "secret_access_key: ${AWS_SECRET}",
    "sk_live_ prefix is documented",
    "from huggingface_hub import hf_hub_download",
    "SG.example.com is a hostname",
    "SKU0123456789abcdef0123456789abcdef",
    "mysql -u root -p -h db.internal app",
    "mysql -P 3306 -h db",
    "mysql -p$MYSQL_PWD app",
    "DB_PASS=$DB_PASS",
    "bypass = True",
    "tests pass: 12",
    "https://hooks.slack.com/services/",
    "xapp is a word",
    "the npm_config_cache folder",
])
def test_catalog_near_misses(text):
    assert redacted(text) == text


def test_every_catalog_entry_is_documented_and_tested():
    from hermes_trove.ingest.redaction import CATALOG
    docs = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    for family, entry, doc in CATALOG:
        assert f"`{entry}`" in docs and doc, entry


@pytest.mark.parametrize("field,value,path", [
    ("reasoning_details", [{"type": "reasoning.text", "text": f"use {OPENAI}"}],
     lambda m: m["reasoning_details"][0]["text"]),
    ("refusal", f"I will not print {OPENAI}", lambda m: m["refusal"]),
    ("tool_calls", [{"id": "c", "type": "function", "function": {
        "name": "db", "arguments": {"dsn": "postgres://app:hunter2@db/x"}}}],
     lambda m: m["tool_calls"][0]["function"]["arguments"]["dsn"]),
    ("content", [{"type": "image_url", "image_url": {"url": "https://ana:hunter2@img.example/a.png"}}],
     lambda m: m["content"][0]["image_url"]["url"]),
])
def test_every_string_field_is_scanned(field, value, path):
    out, count = ALL.redact_message({"role": "assistant", field: value})
    assert count == 1 and OPENAI not in str(out) and "hunter2" not in str(out)
    assert "[REDACTED:" in path(out)


def test_false_positives_on_the_bundled_sample_are_rare():
    sample = Path(__file__).resolve().parent.parent / "samples" / "coding-session.jsonl"
    messages = [json.loads(line) for line in sample.read_text().splitlines() if line.strip()]
    hits = sum(ALL.redact_message(m)[1] for m in messages)
    assert len(messages) > 100 and hits == 0


def test_opaque_provider_blobs_round_trip_exactly():
    blob = f"{JWT}+{OPENAI}"  # looks like secrets, but is a signed/encrypted payload
    message = {"role": "assistant", "content": "ok",
               "reasoning_details": [{"type": "reasoning.encrypted", "data": blob},
                                     {"type": "reasoning.text", "text": "t", "signature": blob}],
               "content_blocks": [{"type": "thinking", "encrypted_content": blob}]}
    assert ALL.redact_message(message) == (message, 0)


# ---------------------------------------------------------------- anchors change nothing
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from hermes_trove.ingest import redaction  # noqa: E402


def _every_detector_on_every_piece(redactor: Redactor, text: str) -> tuple[str, int]:
    """The redaction before detectors had anchors: every enabled detector scans every
    piece between placeholders, in order (the reference the anchored one must equal)."""
    total = 0
    for name in redactor.enabled_names:
        for rule in redaction._RULES[name]:
            pieces, pos = [], 0
            for match in redaction._PLACEHOLDER_RE.finditer(text):
                out, count = rule.apply(text[pos:match.start()])
                pieces += [out, match.group(0)]
                pos, total = match.end(), total + count
            out, count = rule.apply(text[pos:])
            text, total = "".join(pieces + [out]), total + count
    return text, total


# Secrets of every detector, near misses, each anchor in other cases (and the non-ASCII
# letters the regex engine folds to ASCII: KELVIN SIGN, long s, dotted/dotless i),
# placeholders, quotes, escapes and separators.
_FRAGMENTS = [
    OPENAI, ANTHROPIC, AWS, GITHUB, SLACK, JWT, "sk-", "AKIA", "ASIA", "ghp_", "gho_",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "xoxp-1234-5678-abcdefgh",
    "xapp-", "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW", "sk_live_0123456789abcdefABCD",
    "rk_test_", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345", "SG.abcdefghijklmnop.qrstuvwxyzABCDEFGH",
    "SK0123456789abcdef0123456789abcdef", "npm_" + "a1B2" * 9, "api_key", "apiKey", "API-KEY",
    "x-api-key", "\u212a", "\u017f", "\u0130", "\u0131", "ap\u0130_key", "api_\u212aey",
    "Authorization", "AUTHORIZATION", "Bearer", "bearer", "BEARER", "eyJ", "password",
    "PassWord", "pa\u017f\u017fword", "passwd", "Passphrase", "_PASS", "_pwd", "DB_",
    "mysql -u root -p", "mariadb", "mysqldump", "postgres://bob:", "https://", "@db:5432",
    "://", "secret", "SECRET_KEY", "client_secret", "Secret-Access-Key", "aws_",
    "access_token", "refreshToken", "id-token", "session_token", "token", "TOKEN",
    "hooks.slack.com/services/", "T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX",
    "discord.com/api/webhooks/", "discordapp.com/api/webhooks/", "123456789/abcdefghijklmnopqrstuvwxyz",
    "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
    "[REDACTED:api_key:sha256=0123abcd]", "[REDACTED:password]", "[REDACTED:", "]",
    "=", ": ", ":", '"', "'", "\\n", "\\\"", "\n", "\r\n", " ", "\t", "_", "-", ".", "/", "@",
    "a1b2c3d4e5f6g7h8", "hunter2", "Zx81Qp07Lm52Ty", "0123456789", "abcdefghijklmnop",
    "\u65e5\u672c\u8a9e", "\U0001f600", "\ud800", "caf\u00e9",
]
# One positive per alternative of every detector's regex (and case and Unicode-fold
# spellings), so a detector whose anchors miss an alternative is caught.
_B = "Ab3dEfGh1jKlMnOpQrStUvWxYz0123456789AbCdEfGh"
_POSITIVES = [
    "sk-" + _B[:24], "AKIAIOSFODNN7EXAMPLE", "ASIAIOSFODNN7EXAMPLE",
    *[f"gh{c}_{_B[:36]}" for c in "pousr"], "github_pat_" + _B[:24],
    *[f"xox{c}-1234-5678-abcdefgh" for c in "abposre"], "xapp-1234-5678-abcdefgh",
    "AIza" + _B[:35], *[f"{a}k_{b}_{_B[:16]}" for a in "sr" for b in ("live", "test")],
    "hf_" + _B[:30], "SG." + _B[:16] + "." + _B[:16], "SK" + "0123456789abcdef" * 2,
    "npm_" + _B[:36], "apikey=Zx81Qp07Lm52Ty", "api_key: Zx81Qp07Lm52Ty",
    "API-KEY=Zx81Qp07Lm52Ty", "X-Api-Key: Zx81Qp07Lm52Ty", "api_\u212aey=Zx81Qp07Lm52Ty",
    "Authorization: Bearer abcdefgh12345678", "AUTHORIZATION=basic dXNlcjpwYXNz",
    "authorization: token 1a2b3c4d5e6f7a8b", "Authorizat\u0130on: digest 1a2b3c4d5e6f7a8b",
    "bearer 0123456789abcdefXYZ", "BEARER 0123456789abcdefXYZ==", JWT,
    "password=hunter2", "passwd: x1", "Passphrase: abc", "PASSWORD='pa ss'",
    "pa\u017f\u017fword=hunter2", "DB_PASS=hunter2", "SMTP_PWD: x1", "db_Pass=hunter2",
    "mysql -u root -phunter2", "mysqldump -phunter2", "mysqladmin -p'x y'",
    "mariadb -phunter2", "postgres://bob:Sup3r@db", "redis://:onlypass@cache",
    *[f"{s}=" + _B[:40] for s in ("aws_secret_access_key", "SecretAccessKey",
                                   "secret-access_key", "AWS-SECRET-ACCESSKEY")],
    "SECRET_KEY=abc123def456", "client_secret=abc123def456", "clientSecret: abc123def456",
    "secretkey=abc123def456", "secret=abc123def456",
    *[f"{w}{sep}token=a1b2c3d4e5f6" for w in ("access", "Refresh", "AUTH", "api", "private",
                                              "session", "id") for sep in ("", "_", "-")],
    *[f"https://hooks.slack.com/{k}/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX"
      for k in ("services", "workflows", "triggers")], "HOOKS.SLACK.COM/services/" + _B[:24],
    "https://discord.com/api/webhooks/123456789/" + _B[:24],
    "https://DiscordApp.com/api/webhooks/123456789/" + _B[:24],
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n"
    "-----END RSA PRIVATE KEY-----", "-----BEGIN OPENSSH PRIVATE KEY-----\\nb3Blbg==",
]
_TEXTS = st.lists(st.sampled_from(_FRAGMENTS + _POSITIVES) | st.text(max_size=6),
                  max_size=24).map("".join)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXTS, st.lists(st.sampled_from(KNOWN_NAMES), min_size=1, unique=True))
def test_anchored_detectors_redact_exactly_as_running_every_detector(text, names):
    """Skipping detectors whose anchor is absent gives byte-identical output and counts."""
    redactor = Redactor(names)
    assert redactor.redact(text) == _every_detector_on_every_piece(redactor, text)


def test_every_detector_has_an_anchor_its_matches_contain():
    """Each catalog entry has anchors, every detector has positives here, and each
    positive a detector matches contains one of its anchors (a missing anchor would
    silently disable a detector for that spelling)."""
    rules = [rule for family in KNOWN_NAMES for rule in redaction._RULES[family]]
    assert all(rule.exact or rule.folded for rule in rules)
    matched = set()
    for text in _POSITIVES + _FRAGMENTS:
        lowered = text.lower() if text.isascii() else None
        for rule in rules:
            if rule.apply(text)[1]:
                matched.add(rule.entry)
                assert rule.may_match(text, lowered), (rule.entry, text)
    assert matched == {rule.entry for rule in rules}
