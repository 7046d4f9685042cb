"""The salt formula against known-answer vectors computed outside the product (tests/salt_vectors.py)."""

from __future__ import annotations

import pytest

from gateway.salts import Salts, derive_salt
from tests.salt_vectors import KNOWN_SALTS, SaltKey


@pytest.mark.parametrize("key", sorted(KNOWN_SALTS, key=repr))
def test_derive_salt_matches_the_known_answer(key: SaltKey) -> None:
    secret, tenant, epoch, user = key
    assert derive_salt(secret.encode(), tenant, epoch, user) == KNOWN_SALTS[key]


def test_the_secret_changes_the_salt() -> None:
    assert derive_salt(b"k", "acme", 3) == "dcd35cde0d2b50501ac9165d7d86f92d4dfbbcd9ed65decb33641409a97fd84c"
    assert derive_salt(b"K", "acme", 3) == "6614c2bbe1552f8d9709da527fa5b09742b7df24108f219643c29325f8ca6d05"


def test_the_user_form_appends_the_user() -> None:
    assert derive_salt(b"k", "acme", 3, "u1") == "28ba8ca80ea82d693c5ea4b6056b4089cb39a79f1b001baf908acdb12e7acc9b"
    assert derive_salt(b"k", "acme", 3, "u1") != derive_salt(b"k", "acme", 3)


def test_an_empty_user_is_still_a_user_form() -> None:
    """`tenant:epoch:` differs from `tenant:epoch`: only None means 'no user'."""
    assert derive_salt(b"k", "acme", 3, "") != derive_salt(b"k", "acme", 3)


@pytest.mark.parametrize("key", sorted(KNOWN_SALTS, key=repr))
def test_the_request_path_deriver_matches_the_known_answer(key: SaltKey) -> None:
    secret, tenant, epoch, user = key
    assert Salts(secret.encode()).derive(tenant, epoch, user) == KNOWN_SALTS[key]


@pytest.mark.parametrize("secret", [b"", b"k", b"k" * 63, b"k" * 64, b"k" * 65, bytes(range(256)) * 2])
@pytest.mark.parametrize("user", [None, "", "u1", "ünï"])
def test_the_request_path_deriver_is_hmac_for_every_secret_length(secret: bytes, user: str | None) -> None:
    """Secrets shorter than, equal to and longer than SHA-256's 64-byte block (HMAC hashes a longer one first)."""
    salts = Salts(secret)
    assert salts.derive("acme", 3, user) == derive_salt(secret, "acme", 3, user)
    assert salts.derive("acme", 3, user) == salts.derive("acme", 3, user)  # its key states are copied, never used up
