"""A corpus of secrets in realistic surroundings (API responses, logs, .env and YAML
files, stack traces, CSV exports) and of look-alikes that are not secrets.

Every secret is made here from a seeded generator in its provider's real format, so the
corpus holds no live credential and the same one on every run. POSITIVES maps each kind
the README promises to samples: (text, the secrets in it). NEGATIVES maps each kind of
look-alike to texts in which nothing may be replaced.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
import uuid

_rng = random.Random(16)
ALNUM = string.ascii_letters + string.digits
LOWER_ALNUM = string.ascii_lowercase + string.digits
UPPER_ALNUM = string.ascii_uppercase + string.digits
B64 = ALNUM + "+/"
URLSAFE = ALNUM + "_-"
HEX = "0123456789abcdef"


def _pick(alphabet: str, n: int) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def _pem(label: str) -> str:
    body = "\n".join(_pick(B64, 64) for _ in range(6))
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----\n"


def _jwt() -> str:
    def part(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    claims = {"sub": _pick(LOWER_ALNUM, 12), "iat": 1732900000, "scope": "repo read"}
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.{_pick(URLSAFE, 43)}"


def _api_response(**secret_fields: object) -> str:
    record = {"id": _rng.randrange(10**6), "name": "deploy-bot", "created_at": "2026-11-02"}
    return json.dumps({"data": [{**record, **secret_fields}], "meta": {"page": 1}}, indent=2)


aws_id, aws_id2 = "AKIA" + _pick(UPPER_ALNUM, 16), "ASIA" + _pick(UPPER_ALNUM, 16)
aws_secret, aws_secret2 = _pick(B64, 40), _pick(B64, 40)
aws_session = _pick(B64, 120)
gcp_key = "AIza" + _pick(URLSAFE, 35)
gcp_pem = _pem("PRIVATE KEY")
azure_secret = _pick(ALNUM, 3) + "8Q~" + _pick(ALNUM + "_~.-", 34)
azure_account_key = _pick(B64, 86) + "=="
stripe_live, stripe_restricted = "sk_live_" + _pick(ALNUM, 99), "rk_live_" + _pick(ALNUM, 24)
github_pat, github_fine = "ghp_" + _pick(ALNUM, 36), "github_pat_" + _pick(ALNUM + "_", 82)
github_app = "ghs_" + _pick(ALNUM, 36)
gitlab_pat, gitlab_runner = "glpat-" + _pick(URLSAFE, 20), "glrt-" + _pick(URLSAFE, 20)
bitbucket_id, bitbucket_secret = _pick(LOWER_ALNUM, 32), _pick(LOWER_ALNUM + "_-", 64)
slack_bot = f"xoxb-{_pick(string.digits, 12)}-{_pick(string.digits, 13)}-{_pick(ALNUM, 24)}"
slack_user = (
    f"xoxp-{_pick(string.digits, 12)}-{_pick(string.digits, 12)}-"
    f"{_pick(string.digits, 13)}-{_pick(HEX, 32)}"
)
slack_hook = (
    f"https://hooks.slack.com/services/T{_pick(UPPER_ALNUM, 8)}/B{_pick(UPPER_ALNUM, 10)}/"
    + _pick(ALNUM, 24)
)
discord_secret, discord_bot = (
    _pick(LOWER_ALNUM, 32),
    (f"{_pick(ALNUM, 26)}.{_pick(URLSAFE, 6)}.{_pick(URLSAFE, 38)}"),
)
telegram = f"{_pick(string.digits, 10)}:AA{_pick(URLSAFE, 33)}"
telegram2 = f"{_pick(string.digits, 9)}:AA{_pick(URLSAFE, 33)}"
openai_key = f"sk-proj-{_pick(URLSAFE, 74)}T3BlbkFJ{_pick(URLSAFE, 74)}"
openai_legacy = f"sk-{_pick(ALNUM, 20)}T3BlbkFJ{_pick(ALNUM, 20)}"
anthropic_key = f"sk-ant-api03-{_pick(URLSAFE, 93)}AA"
anthropic_admin = f"sk-ant-admin01-{_pick(URLSAFE, 93)}AA"
hf_token, hf_org = (
    "hf_" + _pick(string.ascii_letters, 34),
    "api_org_" + _pick(string.ascii_letters, 34),
)
npm_token, npm_token2 = "npm_" + _pick(ALNUM, 36), "npm_" + _pick(ALNUM, 36)
pypi_token = "pypi-AgEIcHlwaS5vcmc" + _pick(URLSAFE, 140)
pypi_token2 = "pypi-AgEIcHlwaS5vcmc" + _pick(URLSAFE, 70)
db_password, mongo_password, redis_password = "S3cr3tPass", _pick(ALNUM, 18), _pick(ALNUM, 24)
git_url_token = "ghp_" + _pick(ALNUM, 36)
rsa_pem, openssh_pem = _pem("RSA PRIVATE KEY"), _pem("OPENSSH PRIVATE KEY")
jwt1, jwt2, jwt3 = _jwt(), _jwt(), _jwt()
bearer1, bearer2 = _pick(URLSAFE, 40), _pick(ALNUM + "._-", 64)
basic1 = base64.b64encode(b"admin:hunter2hunter2").decode()
basic2 = base64.b64encode(b"ci-user:" + _pick(ALNUM, 16).encode()).decode()
field_password, field_client_secret = "correct horse battery staple", _pick(ALNUM, 30)
field_api_key, field_pin = "not-a-known-format-" + _pick(LOWER_ALNUM, 8), 48213
env_secret, env_password, yaml_token, yaml_password = (
    _pick(ALNUM, 50),
    "p@ss w0rd!",
    _pick(ALNUM, 32),
    "swordfish-" + _pick(LOWER_ALNUM, 6),
)
csv_token1, csv_token2 = _pick(ALNUM, 20), _pick(ALNUM, 20)

POSITIVES: dict[str, list[tuple[str, list[str]]]] = {
    "aws": [
        (
            _api_response(
                Credentials={
                    "AccessKeyId": aws_id2,
                    "SecretAccessKey": aws_secret,
                    "SessionToken": aws_session,
                    "Expiration": "2026-11-30T18:00:00Z",
                }
            ),
            [aws_id2, aws_secret, aws_session],
        ),
        (
            f"[default]\naws_access_key_id = {aws_id}\naws_secret_access_key = {aws_secret2}\n"
            "region = eu-west-1\n",
            [aws_id, aws_secret2],
        ),
    ],
    "gcp": [
        (
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": "acme-prod",
                    "private_key_id": _pick(HEX, 40),
                    "private_key": gcp_pem,
                    "client_email": "deployer@acme-prod.iam.gserviceaccount.com",
                },
                indent=2,
            ),
            [gcp_pem.splitlines()[3]],
        ),
        (
            f"2026-11-30T10:02:11Z WARN maps: request failed url=https://maps.googleapis.com/"
            f"maps/api/geocode/json?address=Berlin&key={gcp_key} status=403",
            [gcp_key],
        ),
    ],
    "azure": [
        (
            _api_response(appId=str(uuid.UUID(int=_rng.getrandbits(128))), password=azure_secret),
            [azure_secret],
        ),
        (
            'Traceback (most recent call last):\n  File "app.py", line 12, in <module>\n'
            "azure.core.exceptions.ClientAuthenticationError: connection string "
            f"DefaultEndpointsProtocol=https;AccountName=acmelogs;AccountKey={azure_account_key};"
            "EndpointSuffix=core.windows.net rejected\n",
            [azure_account_key],
        ),
        (f"AZURE_CLIENT_ID=3f1c\nsecret={azure_secret} # rotated monthly\n", [azure_secret]),
    ],
    "stripe": [
        (
            f"stripe.error.AuthenticationError: Invalid API Key provided: {stripe_live}\n"
            '  File "billing/charge.py", line 88, in charge\n',
            [stripe_live],
        ),
        (
            json.dumps({"integrations": [{"name": "stripe", "key": stripe_restricted}]}),
            [stripe_restricted],
        ),
    ],
    "github": [
        (
            f"$ git clone https://x-access-token:{github_app}@github.com/acme/widgets.git\n"
            "Cloning into 'widgets'...\n",
            [github_app],
        ),
        (_api_response(note="ci token", value=github_pat), [github_pat]),
        (f"GH_TOKEN={github_fine}\nGH_REPO=acme/widgets\n", [github_fine]),
    ],
    "gitlab": [
        (
            f'curl --header "PRIVATE-TOKEN: {gitlab_pat}" https://gitlab.example.com/api/v4/projects',
            [gitlab_pat],
        ),
        (
            f"runners:\n  - name: docker-runner\n    url: https://gitlab.example.com\n"
            f"    id: 42\n    auth: {gitlab_runner}\n",
            [gitlab_runner],
        ),
    ],
    "bitbucket": [
        (
            f"BITBUCKET_CLIENT_ID={bitbucket_id}\nBITBUCKET_CLIENT_SECRET={bitbucket_secret}\n",
            [bitbucket_id, bitbucket_secret],
        ),
        (
            json.dumps({"bitbucket": {"workspace": "acme", "oauth_secret": bitbucket_secret}}),
            [bitbucket_secret],
        ),
    ],
    "slack": [
        (
            f"INFO slack: posting to #deploys with {slack_bot}\n"
            "INFO slack: ok=true ts=1732960000\n",
            [slack_bot],
        ),
        (
            _api_response(webhook=slack_hook, user_token=slack_user),
            [slack_hook.rsplit("/", 1)[1], slack_user],
        ),
    ],
    "discord": [
        (f"DISCORD_CLIENT_ID=1097\nDISCORD_CLIENT_SECRET={discord_secret}\n", [discord_secret]),
        (_api_response(discord_bot_token=discord_bot), [discord_bot]),
    ],
    "telegram": [
        (f"TELEGRAM_BOT_TOKEN={telegram}\n", [telegram]),
        (
            f"requests.exceptions.HTTPError: 409 Client Error: Conflict for url: "
            f"https://api.telegram.org/bot{telegram2}/getUpdates\n",
            [telegram2],
        ),
    ],
    "openai": [
        (f"OPENAI_API_KEY={openai_key}\nOPENAI_ORG=org-acme\n", [openai_key]),
        (
            f"openai.AuthenticationError: Error code: 401 - Incorrect API key provided: "
            f"{openai_legacy}. You can find your API key at https://platform.openai.com.",
            [openai_legacy],
        ),
    ],
    "anthropic": [
        (
            json.dumps({"provider": "anthropic", "headers": {"x-api-key": anthropic_key}}),
            [anthropic_key],
        ),
        (f"export ANTHROPIC_ADMIN_KEY='{anthropic_admin}'\n", [anthropic_admin]),
    ],
    "huggingface": [
        (
            f"huggingface_hub.errors.HfHubHTTPError: 401 Unauthorized (token {hf_token})",
            [hf_token],
        ),
        (json.dumps({"hub": {"org": "acme", "org_token": hf_org}}), [hf_org]),
    ],
    "npm": [
        (f"//registry.npmjs.org/:_authToken={npm_token}\nalways-auth=true\n", [npm_token]),
        (
            f"npm ERR! code E401\nnpm ERR! Unable to authenticate, token {npm_token2} revoked\n",
            [npm_token2],
        ),
    ],
    "pypi": [
        (
            f"[distutils]\nindex-servers = pypi\n\n[pypi]\nusername = __token__\n"
            f"password = {pypi_token}\n",
            [pypi_token],
        ),
        (f"twine upload dist/* -u __token__ -p {pypi_token2}\n", [pypi_token2]),
    ],
    "url_credentials": [
        (
            _api_response(database_url=f"postgres://admin:{db_password}@db.internal:5432/prod"),
            [db_password],
        ),
        (
            f"pymongo.errors.OperationFailure: Authentication failed, full error: "
            f"mongodb+srv://app:{mongo_password}@cluster0.ab1cd.mongodb.net/?retryWrites=true\n",
            [mongo_password],
        ),
        (f"CACHE=redis://:{redis_password}@cache.internal:6379/0\n", [redis_password]),
        (
            f"remote: https://ci:{git_url_token}@github.com/acme/widgets.git\n",
            [git_url_token],
        ),
    ],
    "private_key": [
        (
            f"$ cat ~/.ssh/id_ed25519\n{openssh_pem}$ ls\n",
            [openssh_pem.splitlines()[2]],
        ),
        (
            json.dumps({"tls": {"cert": "-----BEGIN CERTIFICATE-----\nMIIB", "key": rsa_pem}}),
            [rsa_pem.splitlines()[4]],
        ),
    ],
    "jwt": [
        (json.dumps({"access": jwt1, "expires_in": 3600}), [jwt1]),
        (f"2026-11-30 10:00:01 DEBUG auth: session cookie={jwt2}; Path=/; HttpOnly", [jwt2]),
        (f"redirect to https://app.example.com/callback#id_token={jwt3}&state=xyz", [jwt3]),
    ],
    "bearer": [
        (
            "> GET /v1/repos HTTP/1.1\n> Host: api.example.com\n"
            f"> Authorization: Bearer {bearer1}\n> Accept: */*\n",
            [bearer1],
        ),
        (
            json.dumps({"request": {"headers": {"Authorization": f"Bearer {bearer2}"}}}),
            [bearer2],
        ),
    ],
    "basic_auth": [
        (f"curl -H 'Authorization: Basic {basic1}' https://jenkins.internal/api/json", [basic1]),
        (
            json.dumps({"headers": {"authorization": f"Basic {basic2}", "accept": "*/*"}}),
            [basic2],
        ),
    ],
    "secret_field_json": [
        (
            _api_response(password=field_password, client_secret=field_client_secret),
            [field_password, field_client_secret],
        ),
        (
            json.dumps([{"service": "geo", "apiKey": field_api_key, "pin_password": field_pin}]),
            [field_api_key, str(field_pin)],
        ),
    ],
    "secret_field_env": [
        (
            f'DJANGO_SECRET_KEY={env_secret}\nDB_PASSWORD="{env_password}"\nDEBUG=false\n',
            [env_secret, env_password],
        ),
        (f"export APP_SECRET='{env_secret[::-1]}'\n", [env_secret[::-1]]),
    ],
    "secret_field_yaml": [
        (
            f"database:\n  host: db.internal\n  user: app\n  password: {yaml_password}\n",
            [yaml_password],
        ),
        (f"slack:\n  channel: '#ops'\n  api-token: \"{yaml_token}\"\n", [yaml_token]),
    ],
    "secret_field_csv": [
        (
            f"id,user,api_token,created\n1,ann,{csv_token1},2026-01-02\n"
            f"2,bob,{csv_token2},2026-01-03\n",
            [csv_token1, csv_token2],
        ),
        (
            f"name,Password\nroot,{field_password}\nops,{env_password}\n",
            [field_password, env_password],
        ),
    ],
    # A JSON encoder may escape any character (\\u00XX), Go's & and Gson's = in a URL,
    # PHP's /; and JSON is often a string in JSON in a string.
    "json_escapes": [
        (
            '{"note": "rotate ' + github_app.replace("s", "\\u0073", 1) + '", '
            '"pass\\u0077ord": "' + field_password + '"}',
            [github_app, field_password],
        ),
        (
            json.dumps(
                {
                    "callback": f"https://app.example.com/cb?state=1&access_token={bearer1}",
                    "dsn": f"postgres://app:{yaml_token}@db.internal:5432/app",
                }
            )
            .replace("&", "\\u0026")
            .replace("/", "\\/"),
            [bearer1, yaml_token],
        ),
    ],
    "nested_json": [
        (
            json.dumps(
                {"body": json.dumps({"data": json.dumps({"client_secret": field_client_secret})})}
            ),
            [field_client_secret],
        ),
        (
            json.dumps(
                [{"log": json.dumps({"req": json.dumps({"Authorization": f"Bearer {bearer2}"})})}]
            ),
            [bearer2],
        ),
    ],
}


def _data_uri() -> str:
    return "data:image/png;base64," + base64.b64encode(_rng.randbytes(3000)).decode()


NEGATIVES: dict[str, list[str]] = {
    "uuids": [
        json.dumps([{"id": str(uuid.UUID(int=_rng.getrandbits(128)))} for _ in range(50)]),
        "\n".join(f"request_id={uuid.UUID(int=_rng.getrandbits(128))} ok" for _ in range(50)),
    ],
    "git_shas": [
        json.dumps(
            [{"sha": _pick(HEX, 40), "parents": [{"sha": _pick(HEX, 40)}]} for _ in range(40)]
        ),
        "\n".join(f"{_pick(HEX, 40)} refs/heads/feature-{i}" for i in range(40)),
    ],
    "sha256_digests": [
        json.dumps(
            [
                {"digest": "sha256:" + hashlib.sha256(_rng.randbytes(8)).hexdigest()}
                for _ in range(40)
            ]
        ),
        "\n".join(
            f"{hashlib.sha256(_rng.randbytes(8)).hexdigest()}  dist/pkg-{i}.tar.gz"
            for i in range(40)
        ),
    ],
    "base64_images": [
        json.dumps({"avatar": _data_uri(), "banner": _data_uri()}),
        f'<img alt="chart" src="{_data_uri()}">',
    ],
    "ids_in_urls": [
        json.dumps(
            [
                {"url": f"https://cdn.example.com/files/{_pick(LOWER_ALNUM, 48)}?download=1"}
                for _ in range(40)
            ]
        ),
        "\n".join(
            f"GET /api/v2/objects/{_pick(URLSAFE, 64)}/versions/{_pick(ALNUM, 32)} 200"
            for _ in range(40)
        ),
    ],
    "token_counts_and_types": [
        json.dumps(
            {
                "usage": {"prompt_tokens": 812, "completion_tokens": 64, "total_tokens": 876},
                "max_tokens": 1024,
                "token_type": "Bearer",
                "tokenizer": "cl100k_base",
            }
        ),
        "Rotate the API key every 90 days; the password policy needs 12 characters and the "
        "token expires after an hour. See docs/secrets.md for the secret store.",
    ],
    "escaped_json": [
        json.dumps(
            [
                {"body": f'<p>See <a href="https://example.com/{i}">#{i}</a> & more</p>'}
                for i in range(40)
            ]
        )
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026"),
        json.dumps(
            {
                "result": json.dumps(
                    {
                        "usage": {"total_tokens": 812, "token_type": "bearer"},
                        "path": "C:\\Users\\ann\\AppData\\token_cache",
                    }
                )
            }
        ),
    ],
}

# Known limits, measured and reported (README) rather than asserted: secrets with no
# label and no provider format, and labels in forms the field rules do not read.
KNOWN_MISSES: dict[str, list[tuple[str, list[str]]]] = {
    "unlabelled_high_entropy": [
        (f"deploy done; signing material {_pick(ALNUM, 40)} loaded", []),
        (f"cache warm: {_pick(B64, 44)}", []),
    ],
    "password_as_cli_flag": [
        ("$ mysql -u root --password hunter2hunter2 prod", ["hunter2hunter2"]),
        ("$ mysql -u root -pS3cr3tPass prod", ["S3cr3tPass"]),
    ],
    "yaml_block_scalar": [
        ("db:\n  password: |\n    multi-line-secret-value\n", ["multi-line-secret-value"]),
        ("tls:\n  private_key: >-\n    folded-secret-value\n", ["folded-secret-value"]),
    ],
    "discord_bot_token_unlabelled": [
        (f"bot logged in with {discord_bot}", [discord_bot]),
        (f"[{discord_bot}] connected to gateway", [discord_bot]),
    ],
}
"""The first kind has no secret string to look for: its figure is the texts left as they
were (the high-entropy value is the secret)."""

KNOWN_FALSE_POSITIVES: dict[str, list[str]] = {
    "prose_with_a_label_and_colon": [
        "Password: must contain 12 characters and one digit.",
        "Note the token: rotate it every 90 days.",
    ],
}
