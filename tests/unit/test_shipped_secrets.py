"""The shipped deployment examples never hold an empty salt secret, or one a gateway would start with."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import SecretStr

from gateway.settings import MIN_SALT_SECRET_BYTES, SaltSecretError, Settings, salt_secret_bytes

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}


def test_systemd_example_has_a_placeholder_serve_refuses() -> None:
    values = env_file(DEPLOY / "systemd" / "kvgate.env.example")
    assert all(values.values()), f"empty values in the example: {[k for k, v in values.items() if not v]}"
    with pytest.raises(SaltSecretError):
        salt_secret_bytes(Settings(salt_secret=SecretStr(values["KVGATE_SALT_SECRET"])))


def test_compose_refuses_an_unset_or_empty_secret_and_init_makes_a_long_one() -> None:
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    gateways = [service for service in compose["services"].values()
                if "KVGATE_SALT_SECRET" in (service.get("environment") or {})]
    assert gateways
    for service in gateways:
        # `${VAR:?message}`: compose stops unless the variable is set and non-empty.
        assert service["environment"]["KVGATE_SALT_SECRET"].startswith("${KVGATE_SALT_SECRET:?")
    init = (DEPLOY / "compose" / "init.py").read_text()
    assert '("KVGATE_SALT_SECRET", secrets.token_hex(32))' in init  # 64 hex characters
    assert MIN_SALT_SECRET_BYTES <= 64


def test_helm_only_references_the_secret() -> None:
    values = yaml.safe_load((DEPLOY / "helm" / "kvgate" / "values.yaml").read_text())
    assert set(values["secrets"]["saltSecret"]) == {"name", "key"}


@pytest.mark.parametrize(("secret", "ok"), [("", False), ("a" * 31, False), ("a" * 32, True), ("é" * 16, True)])
def test_secret_length_is_counted_in_bytes(secret: str, ok: bool) -> None:
    settings = Settings(salt_secret=SecretStr(secret))
    if ok:
        assert salt_secret_bytes(settings) == secret.encode()
    else:
        with pytest.raises(SaltSecretError):
            salt_secret_bytes(settings)
