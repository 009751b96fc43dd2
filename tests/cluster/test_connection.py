"""The server URL forms of ``fairlane.store.connection``: what each names, and the mistakes
refused before any connection is tried."""

from __future__ import annotations

import pytest

from fairlane import App
from fairlane.store.connection import (
    ServerAddress,
    cluster_url,
    parse_address,
    sentinel_url,
)


def test_standalone_urls_pass_through() -> None:
    for url in ("redis://h:1/0", "rediss://u:p@h:2/3", "unix:///tmp/s.sock?db=1"):
        assert parse_address(url) == ServerAddress("standalone", url)


def test_cluster_url_names_every_node_and_the_login() -> None:
    url = "rediss+cluster://me:s%40cret@a:7000,b,[::1]:7002/"
    address = parse_address(url)
    assert address.kind == "cluster"
    assert address.nodes == (("a", 7000), ("b", 6379), ("::1", 7002))
    assert (address.username, address.password, address.tls) == ("me", "s@cret", True)
    assert parse_address(cluster_url(["a:7000", ("b", 6379), "[::1]:7002"])).nodes == (
        address.nodes
    )
    assert cluster_url(["a:1"], password="p w") == "redis+cluster://:p%20w@a:1/"


def test_sentinel_url_names_the_service_and_database() -> None:
    address = parse_address("redis+sentinel://s1:26380,s2/mymaster/2")
    assert address.kind == "sentinel"
    assert address.nodes == (("s1", 26380), ("s2", 26379))
    assert (address.service_name, address.db, address.tls) == ("mymaster", 2, False)
    assert parse_address("redis+sentinel://s1/mymaster").db == 0
    assert sentinel_url(["s1:26380"], "mymaster") == "redis+sentinel://s1:26380/mymaster/0"


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster:///",  # no node
        "redis+cluster://a:1/3",  # a cluster has database 0 only
        "redis+cluster://a:notaport/",
        "redis+cluster://a:70000/",
        "redis+cluster://a:1/?timeout=3",  # query options are not read: refused, not ignored
        "redis+sentinel://s1:26379",  # no service
        "redis+sentinel://s1:26379/svc/x",  # bad database
        "redis+sentinel://s1:26379/svc/0/extra",
    ],
)
def test_malformed_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        parse_address(url)


def test_app_options_are_spelt_as_urls() -> None:
    assert App("a", cluster_nodes=["n1:7000", "n2:7001"]).redis_url == (
        "redis+cluster://n1:7000,n2:7001/"
    )
    assert App("a", sentinels=["s:26379"], service_name="m").redis_url == (
        "redis+sentinel://s:26379/m/0"
    )
    with pytest.raises(ValueError, match="one of"):
        App("a", redis_url="redis://h/0", cluster_nodes=["n:1"])
    with pytest.raises(ValueError, match="together"):
        App("a", service_name="m")
