"""Known-answer `cache_salt` vectors, computed once outside the product and pasted here as literals.

Each value was produced by an independent tool, for example
`printf '%s' 'acme:1' | openssl dgst -sha256 -hmac 'gateway-test-secret'`, so a derivation that ignored
the secret, joined the fields differently or dropped the user would disagree with these values. Tests
must take expected salts from here (never from `gateway.salts`); add a vector the same way when a test
needs a new (secret, tenant, epoch, user).
"""

from __future__ import annotations

GATEWAY_SECRET = "gateway-test-secret"  # what `tests.harness.new_secret()` hands to served gateways
LEDGER_SECRET = "ledger-test-secret"
UNIT_SECRET = "unit-secret"

SaltKey = tuple[str, str, int, str | None]  # (secret, tenant, epoch, user)

KNOWN_SALTS: dict[SaltKey, str] = {
    (GATEWAY_SECRET, "acme", 1, None): "cb5c4d29040fda7d5b2e90f41569d5bbd40090738e1577c132fbccaa97e172e1",
    (GATEWAY_SECRET, "acme", 7, None): "8b3efa265c3d087ac3c202501f7b757fc26ba49d36f5ecb94279bb244acf92bc",
    (GATEWAY_SECRET, "beta", 1, None): "1510d855ae9dc8d20c6bd3554d64da55e09b19903f6631143f302f9891b13c68",
    (GATEWAY_SECRET, "gamma", 1, None): "0326094fc5eeeb37a729721319d519da43d59582818b77ee84f845bdafe1d650",
    (GATEWAY_SECRET, "gamma", 1, "alice"): "cd862a05a0265fce4474fec99aa2fc7efc79a4771a7688bc64f1638d1ddb381b",
    (GATEWAY_SECRET, "gamma", 1, "bob"): "0ab6a0a7147cdc28594460f5c8c266a655002934add9490ecbf86954f7939d83",
    (GATEWAY_SECRET, "gamma", 1, "carol"): "2ea600e7b95985290ffd80a2d44566a767792316b1eb8a54fbde647c210fd1f2",
    (GATEWAY_SECRET, "delta", 1, None): "57fe296d5ab0dca89bf8c1535dbc2fc9a827275ac59973f0b93f59bb278571c0",
    (GATEWAY_SECRET, "ops", 1, None): "e65ad9bd5cfde031c69fd17051a112a90e178bf23553c9f7d90a6fbe6768fc94",
    (GATEWAY_SECRET, "root", 1, None): "b507461f7f7615fb873b6c00ee7d22f11a6cb1221858cfb1c3036b228c4ee006",
    (GATEWAY_SECRET, "ab", 1, None): "fff8c574ec0cca450ab130adb4ce9bffa987118655219c657c982ae7c6200c3f",
    # tests/lmcache: one tenant per pool and behaviour
    (GATEWAY_SECRET, "acme-lm", 1, None): "2311041187eeaa60c0116bb3ea238f4424d3197e6309ebaf9fa618b5564698e7",
    (GATEWAY_SECRET, "beta-lm", 1, None): "35fd7f5f9e7a3d803bf598198202e5f80619be531298100b158641728857065c",
    (GATEWAY_SECRET, "acme-plain", 1, None): "103d32ff0ff87c978073fb0ed6095d9eb2eb8c6eca8a9ece7aa2846136e3bcff",
    (GATEWAY_SECRET, "beta-plain", 1, None): "247103d9bb2796c40aa7ca742245d30b6ce11f7423ffa2acd5ccd8e30a955411",
    (GATEWAY_SECRET, "acme-down", 1, None): "89830977707e500a3f70117ed9440ac5e0ded395e173764323032c956c104fb2",
    (GATEWAY_SECRET, "beta-down", 1, None): "61e2f53a963f542eb53326c34be7064064493087c1187bdc25528537fc2a2bb4",
    (GATEWAY_SECRET, "quiet-lm", 1, None): "b9b2f9fa1ca20a2a90fe817b537afeb28ce2e82e72b471ff69c8163869c8fe2f",
    (GATEWAY_SECRET, "users-lm", 1, None): "6e963bc4c903a5d4e2e83cad744b2a43c32d7a09aa488fa2715eb9b6ecf5daff",
    (GATEWAY_SECRET, "mirror-plain", 1, None): "563889d0d6dc337c5728ca113624bb1f4dc0948aec8ea26fa4618c2be563f164",
    (LEDGER_SECRET, "acme", 1, None): "70ce872645b0d1f37408cdbbab3b9a9d47525212ba0f01b1f4b7ed5a734cfa86",
    (LEDGER_SECRET, "acme", 2, None): "b802c06d875ccf524517dbb22e6b4f87a5782a175d4aff553f71d24166d731e2",
    (LEDGER_SECRET, "globex", 1, None): "991f463b8185e2053166a1906f54f1339c5726831a842c6e7bd7feaf78a37586",
    (LEDGER_SECRET, "globex", 1, "u1"): "48102bbfc5befd355d58ba8782e2bd50e4216e2265521f869c1be4911498b1a0",
    (LEDGER_SECRET, "globex", 1, "u2"): "d02bf4809abf91ba210d7b1cbd6d82daa9f6c6c889f8c8b10b1db2e7b92740e0",
    (LEDGER_SECRET, "initech", 1, None): "15c899f4ae31b36b2f0214ea58806380b72ed5088b8ba3d9d5c138783e22297e",
    (LEDGER_SECRET, "initech", 2, None): "bf4ae3fa3727b4bf17f8f4103d2b0363d06a08e659bb3d718f239c29effb32e6",
    (UNIT_SECRET, "acme", 1, None): "e63976d79e43f0ab546c4a09c845af397c01a1f53d2a958722d8d38eef61dac8",
    (UNIT_SECRET, "acme", 3, None): "f68ef0974d21ea56b2294de0c248ddfb2a6ba385c92acad272a2f16dda78631c",
    (UNIT_SECRET, "acme", 1, "u1"): "53ec697e8a905687dd1d9989da5e8a5ed65ef535ba5bc4595db3f201403bbec2",
    (UNIT_SECRET, "acme", 1, "hdr"): "2177ba399a6a9b44fdf0b34405cbdba734adbdff425241d50434a6596cef2df2",
    # One message under two secrets that differ only in case: the secret must change the result.
    ("k", "acme", 3, None): "dcd35cde0d2b50501ac9165d7d86f92d4dfbbcd9ed65decb33641409a97fd84c",
    ("K", "acme", 3, None): "6614c2bbe1552f8d9709da527fa5b09742b7df24108f219643c29325f8ca6d05",
    ("k", "acme", 3, "u1"): "28ba8ca80ea82d693c5ea4b6056b4089cb39a79f1b001baf908acdb12e7acc9b",
    ("K", "acme", 3, "u1"): "cafc1e8d317e0eb37a13dd30d85cca369e2c0eddfccba3b86e9a267b3f6dd5ad",
}


def known_salt(secret: str, tenant: str, epoch: int = 1, user: str | None = None) -> str:
    """The literal vector for these inputs; a missing one is a test-authoring error, never computed here."""
    try:
        return KNOWN_SALTS[(secret, tenant, epoch, user)]
    except KeyError:
        raise KeyError(f"no known-answer salt for {(tenant, epoch, user)} under this secret: compute it with "
                       "openssl dgst -sha256 -hmac and add it to tests/salt_vectors.py") from None
