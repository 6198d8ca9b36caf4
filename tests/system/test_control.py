"""The control plane on a real daemon: `show config` round trip through a fresh vnetd, and
atomic scripts (a bad line or a failure half-way changes nothing)."""


def _links_without_state(host):
    return sorted(({k: v for k, v in l.items() if k != "state"} for l in host.ctl_json("show", "links", "json")),
                  key=lambda l: l["name"])


def _snapshot(host):
    return {
        "interfaces": sorted(host.ctl_json("show", "interfaces", "json"), key=lambda i: i["name"]),
        "links": _links_without_state(host),
        "routes": sorted(host.ctl_json("show", "routes", "json"), key=lambda r: sorted(r.items())),
        "listeners": host.ctl("show", "listeners", "json"),
    }


def test_show_config_round_trip(lab):
    A = lab.host("A")
    lan = lab.netns("lan")
    lab.veth(A, "lan0", lan, "eth0")
    g1, g2 = lab.guest("g1"), lab.guest("g2")
    A.start_vnetd()
    n = lab.subnet
    for cmd in (
        f"interface add vm1 tap mac 52:54:00:00:01:01 netns {g1.name}",
        f"interface add vm2 tap netns {g2.name} mtu 9000 vni 2",  # random MAC
        "interface add vm3 tap ifname vn-third vni 7",  # stays in the host namespace
        f"link add u1 udp {n}.2",
        f"link add u2 udp {n}.3:4790 vni 2",
        f"link add t1 tcp {n}.250:7700 vni 7",
        f"link add t2 tcp accept {n}.2 vni 2",
        "link add lan direct lan0",
        f"listen tcp {A.underlay_ip}:7700",
        "interface set vm1 any-source on rate 100 burst 200",
        "link set u2 rate 30",
        "route add any 52:54:00:00:01:01 interface vm1",
        "route add not 52:54:00:00:01:01 broadcast link u1",
        "route add 52:54:00:00:01:01 not 52:54:00:00:02:02 link lan",
        "route add any any link u1",
        "route add any 52:54:00:00:02:02 link u2",
        "route add any 52:54:00:00:02:03 link t2",
        "route add any any link t1",
        "set learn on",
    ):
        A.ctl(*cmd.split())
    vm2_mac = A.interface("vm2")["mac"]
    A.ctl("route", "add", "any", vm2_mac, "interface", "vm2")

    before = _snapshot(A)
    assert len(before["interfaces"]) == 3 and len(before["links"]) == 5 and len(before["routes"]) == 8
    assert [(i["name"], i["any_source"], i["rate"]) for i in before["interfaces"] if i["rate"]] == \
        [("vm1", True, {"mbit": 100, "burst_kb": 200})]
    assert [(l["name"], l["rate"]["mbit"]) for l in before["links"] if l["rate"]] == [("u2", 30)]
    config = A.ctl("show", "config")
    path = lab.workdir / "shown.conf"
    path.write_text(config)

    # SIGTERM: clean exit, its TAPs are gone
    assert A.stop_vnetd() == 0
    assert "vn-third" not in A.links()
    assert set(g1.links()) == {"lo"} and set(g2.links()) == {"lo"}

    # a fresh daemon started from the shown config has the same state
    A.start_vnetd(config_path=path)
    after = _snapshot(A)
    for k in before:
        assert after[k] == before[k], f"{k} differ after the round trip:\n{before[k]}\n{after[k]}"
    assert sorted(A.ctl("show", "config").splitlines()) == sorted(config.splitlines())
    assert "vn-third" in A.links() and len(g1.links()) == 2 and len(g2.links()) == 2

    # deleting an interface or link removes the routes that point at it
    A.ctl("interface", "del", "vm1")
    A.ctl("link", "del", "u1")
    names = {r["name"] for r in A.ctl_json("show", "routes", "json")}
    assert "vm1" not in names and "u1" not in names and "lan" in names
    assert set(g1.links()) == {"lo"}


def test_scripts_are_atomic(lab):
    A = lab.host("A")
    g = lab.guest("g")
    lab.veth(A, "lan0", lab.netns("lan"), "eth0")
    A.start_vnetd()
    A.ctl("link", "add", "keep", "udp", f"{lab.subnet}.9")
    state0 = _snapshot(A)

    # a bad third line: refused whole, with its line number
    r = A.script(f"""interface add s1 tap mac 52:54:00:00:05:01 netns {g.name}
route add any 52:54:00:00:05:01 interface s1
link add s2 udp 10.99.0.999
""", check=False)
    assert r.returncode != 0
    assert "line 3" in r.stderr, r.stderr
    assert _snapshot(A) == state0
    assert set(g.links()) == {"lo"}

    # valid text, but the OS refuses line 2 (lan0 is a veth, not a TAP): line 1 is undone
    r = A.script(f"""interface add s1 tap mac 52:54:00:00:05:01 netns {g.name}
interface add s3 tap ifname lan0
""", check=False)
    assert r.returncode != 0, r.stdout
    assert _snapshot(A) == state0
    assert set(g.links()) == {"lo"}, "the TAP of line 1 was not removed"

    # a valid script applies completely
    A.script(f"""# comment
interface add s1 tap mac 52:54:00:00:05:01 netns {g.name}   # trailing comment

route add any 52:54:00:00:05:01 interface s1
route add any any link keep
""")
    snap = _snapshot(A)
    assert [i["name"] for i in snap["interfaces"]] == ["s1"]
    assert len(snap["routes"]) == 2
    assert len(g.links()) == 2
    assert A.vnetd.alive()
