"""Known-answer `cache_salt` vectors, computed once outside the product and pasted here as literals.

Each value was produced by an independent tool, for example
`printf '%s' 'acme:1' | openssl dgst -sha256 -hmac 'gateway-test-secret-of-at-least-32-bytes'`, so a
derivation that ignored the secret, joined the fields differently or dropped the user would disagree with
these values. Tests must take expected salts from here (never from `gateway.salts`); add a vector the same
way when a test needs a new (secret, tenant, epoch, user).
"""

from __future__ import annotations

# What `tests.harness.new_secret()` hands to served gateways (which refuse a secret under 32 bytes).
GATEWAY_SECRET = "gateway-test-secret-of-at-least-32-bytes"
LEDGER_SECRET = "ledger-test-secret-of-at-least-32-bytes"
UNIT_SECRET = "unit-secret"

SaltKey = tuple[str, str, int, str | None]  # (secret, tenant, epoch, user)

KNOWN_SALTS: dict[SaltKey, str] = {
    (GATEWAY_SECRET, "acme", 1, None): "a177b1287e445c7b774eff569fea8abdfb3497e60c0629368b399ac6f094addb",
    (GATEWAY_SECRET, "acme", 7, None): "3afa14c953ca1a704f05ac2dad894c65bbd5a4c742c100931f8d001a54648496",
    (GATEWAY_SECRET, "beta", 1, None): "dcab37b5bc459381f28f1c0904717885e7a52575ee55a60333477aefa7f672c5",
    (GATEWAY_SECRET, "gamma", 1, None): "71954267346c24766942e1f1b8a1e196424ca8fc1b0766f4dd0c0f4058e1365e",
    (GATEWAY_SECRET, "gamma", 1, "alice"): "b6550b3bea48d7bb9737e4bfafe018dc6f2a074f9450e946b8985d4c2f21849b",
    (GATEWAY_SECRET, "gamma", 1, "bob"): "311292eb2aba9d39c7f068e60ad852fbb2c7a996f005c6a6e23fc9d0061cf8fd",
    (GATEWAY_SECRET, "gamma", 1, "carol"): "c1d9e5fcf5a449fe8f0eff9de958f2af3238cf244c8edfdbb1062d0dbb090bbf",
    (GATEWAY_SECRET, "delta", 1, None): "36d4197eb803c1ac3f62e76dbc50573ede16856202da3091f62240a1b19aa6e6",
    (GATEWAY_SECRET, "ops", 1, None): "52c634700142caafc5478479bb50f775ac4e3a5729b59417f6ded427e2c5f2e8",
    (GATEWAY_SECRET, "root", 1, None): "a2fe45478ad49cfdac274c5a3d1f23bca8bbd1850303e7f487806d591e75424e",
    (GATEWAY_SECRET, "ab", 1, None): "92a432ffc09c48b87a515fc81ca2cc6c6a5994ff77a2d90447ee63c50bd56256",
    (GATEWAY_SECRET, "acme", 2, None): "6d6e82f394e25f374e982f66a70f84c79d854914d75c150e37f4dd24b8a96ac6",
    (GATEWAY_SECRET, "globex", 1, None): "c4eb51bc0e93b054b36f11f5a1b2e5e6bb369b8be8d98e0dd3e1e18f8677b99f",
    (GATEWAY_SECRET, "globex", 2, None): "8989b8ba03833cd93d2130dca611781cba4dc121a80ade4d7b6e3f4a9b6ee638",
    (GATEWAY_SECRET, "acme", 3, None): "687a2a404739979949024ffa845e20cc23d8a198a5ea6c3e8b7a25e038e28437",
    # tests/lmcache: one tenant per pool and behaviour
    (GATEWAY_SECRET, "acme-lm", 1, None): "f14936d57cead2982dece72647342b58c6a0d62f4d93ea3e087f4d79e3ce0ec0",
    (GATEWAY_SECRET, "beta-lm", 1, None): "59fa1cf334b5e67a304a02e2e67e6566bec7df54920a40dc19c3b8331592fe69",
    (GATEWAY_SECRET, "acme-plain", 1, None): "06cbf5071c15dab7edae9911e0f73c7c3236cd8d6e4e08b6ff2c438450d19d8f",
    (GATEWAY_SECRET, "beta-plain", 1, None): "20a4acc8c35b4c02bd3ffc1793cd79c9a6b4348704e10fcbb092da8dec588da3",
    (GATEWAY_SECRET, "acme-down", 1, None): "cac8cab5ef1ebb3f0cc99685139694dc331bc990abfd8a1cf076bf4782cee195",
    (GATEWAY_SECRET, "beta-down", 1, None): "368cbb6c413a89db8f4c5edd3e8f298ba0cacb91b588dbf07cde138227caa184",
    (GATEWAY_SECRET, "quiet-lm", 1, None): "318083a228cca0cea931d2c3aa156617cce302bab989388ad1d859f8c2b033f4",
    (GATEWAY_SECRET, "users-lm", 1, None): "7712e758796a3879fd8ef243213b86029082e82b3dcaf415c85ca9403cd0d979",
    (GATEWAY_SECRET, "docs-lm", 1, None): "3e0be66f313e543f968f7e7d17423bdb1d195440ba8f7fe3e67eda7f7012932a",
    (GATEWAY_SECRET, "mirror-plain", 1, None): "c3cfdf92f6c4005e1f8967526d5a89b308d9faf54e152cd2c6f4ae60f2a38237",
    (LEDGER_SECRET, "acme", 1, None): "db98bc0948af48391b4e7b888141bd8d05aeb13c442de3a5d05827e99421587d",
    (LEDGER_SECRET, "acme", 2, None): "2b7f639dba800cd89f5c43bfb2acc0990f509b1a09867f298b259f445eaeab06",
    (LEDGER_SECRET, "globex", 1, None): "d43a5ddfdc25177451ba5294d98449b55f8b7605f284ede3b1395c326f28ad2e",
    (LEDGER_SECRET, "globex", 1, "u1"): "154796f27c6519f28de7a69cc76f523e826cd344bb5b788693155c6272d99205",
    (LEDGER_SECRET, "globex", 1, "u2"): "a859f3b4159629e3a3824a8a846f0ecd3f34bce1c89df2f31528ba391926120d",
    (LEDGER_SECRET, "initech", 1, None): "66160398c8224e9fc1b53189c4123aa12145c7e354ab8e7ed5b718f350e27bed",
    (LEDGER_SECRET, "initech", 2, None): "ff0717c805eeb1dbda9e460958d55db672ddc7695bf61b2f9a905540c0c544bb",
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
