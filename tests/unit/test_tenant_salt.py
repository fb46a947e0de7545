"""Per-tenant cache salting (issue 39 item 8): the router's cache_salt per tenant, the salted block hashes (vLLM's
prefix cache takes the salt into the first block's hash), the client's own cache_salt checked as vLLM checks it."""

from __future__ import annotations

import pytest

from prfaas_core.request.params import check_request, tenant_salt
from prfaas_core.request.tokens import block_hashes


def test_tenants_get_distinct_salts_that_vllm_accepts() -> None:
    a, b = tenant_salt("a"), tenant_salt("b")
    assert a != b and len(a) == 64 and a.isalnum()
    assert tenant_salt("a") == a and tenant_salt(None) == tenant_salt("")  # no header: one shared salt
    assert tenant_salt("a", "mine") != a  # a client's own salt splits its tenant's cache further
    check_request({"cache_salt": a}, False)


def test_salted_hashes_share_no_block_across_salts() -> None:
    ids = list(range(64))
    plain, salted, other = block_hashes(ids, 16), block_hashes(ids, 16, "a"), block_hashes(ids, 16, "b")
    assert len(plain) == len(salted) == 4
    assert not set(plain) & set(salted) and not set(salted) & set(other)
    assert block_hashes(ids, 16, "a") == salted
    assert block_hashes(ids, 16, None) == plain


@pytest.mark.parametrize("salt", ["", 7, "a/b", "x" * 129, "a@b"])
def test_a_bad_client_salt_is_a_400_naming_the_field(salt: object) -> None:
    with pytest.raises(ValueError, match="'cache_salt'"):
        check_request({"cache_salt": salt}, False)
