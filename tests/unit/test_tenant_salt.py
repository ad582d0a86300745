"""Per-tenant cache isolation: the salt the ingress gives vLLM, and the router's salted block hashes."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deployments.errors import APIError
from deployments.kv_events import first_block_salt
from deployments.tenant_salt import request_salt
from router.block_hash import ROOT_HASH, chain_hashes, salted_root
from router.engine_blocks import EngineBlockSet

tenants = st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=12)
client_salts = st.none() | st.text(min_size=1, max_size=20)


@given(tenants, tenants, client_salts, client_salts)
def test_no_client_salt_reaches_another_tenants_blocks(t1, t2, s1, s2):
    if t1 != t2:
        assert request_salt(t1, s1, "tenant") != request_salt(t2, s2, "tenant")


@given(tenants, client_salts)
def test_isolation_is_stable_within_a_tenant_and_a_valid_vllm_salt(tenant, client):
    salt = request_salt(tenant, client, "tenant")
    assert salt == request_salt(tenant, client, "tenant")
    assert 0 < len(salt) <= 128 and not set(salt) & set("@/\\\0")  # vLLM's own rule for cache_salt


def test_shared_mode_passes_the_clients_salt_through():
    assert request_salt("acme", None, "shared") is None
    assert request_salt("acme", "mine", "shared") == "mine"
    assert request_salt("acme", None, "tenant") != request_salt("globex", None, "tenant")


@pytest.mark.parametrize("bad", ["", 42, ["x"]])
def test_a_malformed_client_salt_is_a_400(bad):
    with pytest.raises(APIError) as e:
        request_salt("acme", bad, "tenant")
    assert e.value.status == 400 and e.value.param == "cache_salt"


def test_salted_roots_differ_and_agree_across_processes():
    assert salted_root(None) == salted_root("") == ROOT_HASH
    assert salted_root("a") != salted_root("b") != ROOT_HASH
    code = "from router.block_hash import salted_root; print(salted_root('kvs-x'))"
    seen = {subprocess.run([sys.executable, "-c", code], env={"PYTHONHASHSEED": seed, "PYTHONPATH": "."},
                           capture_output=True, text=True, check=True).stdout for seed in ("1", "2")}
    assert seen == {f"{salted_root('kvs-x')}\n"}


def test_engine_events_of_a_salted_prompt_match_the_ingress_hashes():
    tokens = list(range(40))
    blocks = EngineBlockSet(block_size=8)
    blocks.stored(["e0", "e1", "e2", "e3", "e4"], None, tokens, salt="kvs-acme")
    assert blocks.prefix_blocks(chain_hashes(tokens, 8, salted_root("kvs-acme"))) == 5
    assert blocks.prefix_blocks(chain_hashes(tokens, 8)) == 0  # the same tokens, unsalted: another cache
    assert blocks.prefix_blocks(chain_hashes(tokens, 8, salted_root("kvs-globex"))) == 0


def test_the_salt_is_read_from_a_prompts_first_stored_block_only():
    ev = SimpleNamespace(parent_block_hash=None, extra_keys=[(("mm-hash", 0), "kvs-acme"), None])
    assert first_block_salt(ev) == "kvs-acme"
    assert first_block_salt(SimpleNamespace(parent_block_hash=7, extra_keys=[("kvs-acme",)])) is None
    assert first_block_salt(SimpleNamespace(parent_block_hash=None, extra_keys=None)) is None
    assert first_block_salt(SimpleNamespace(parent_block_hash=None)) is None  # vLLM 0.24's events
