"""Multi-node replicas: nodes on one declared fabric, adapters per rank, a leader and its port."""

from __future__ import annotations

from test_placement_data import gpu, hca, ib_fabric, node, spec

from llmgw.control.placement import fit


def ib_node(nid: str, fabric: str, *adapters: str, gpus: int = 2, down: tuple[str, ...] = (), **kw: object):  # type: ignore[no-untyped-def]
    return node(nid, gpus=tuple(gpu(i) for i in range(gpus)), fabrics=(ib_fabric(fabric, *adapters),),
                hcas=tuple(hca(a, "DOWN" if a in down else "ACTIVE") for a in adapters),
                mgmt_addr=f"10.0.0.{nid[-1]}", **kw)  # type: ignore[arg-type]


def test_ranks_share_one_fabric_and_get_its_adapters() -> None:
    """Two nodes of ib-a are chosen over one of ib-b; ranks get GPUs and adapters, rank 0 leads."""
    nodes = [ib_node("n1", "ib-a", "mlx5_0", "mlx5_1"), ib_node("n2", "ib-b", "mlx5_0"),
             ib_node("n3", "ib-a", "mlx5_0")]
    placer = fit.Placer(nodes)
    group = fit.place_group(placer, "big", spec(gpus=2, tp=2, nnodes=2), replica_id="r1")
    assert isinstance(group, fit.Group)
    assert group.fabric == "ib-a"
    assert group.ranks == (fit.Rank(0, "n1", (0, 1), ("mlx5_0", "mlx5_1")), fit.Rank(1, "n3", (0, 1), ("mlx5_0",)))
    assert (group.leader_addr, group.leader_port) == ("10.0.0.1", 29500)


def test_gpus_taken_by_a_group_are_not_given_again() -> None:
    """A second group in the pass finds the first one's GPUs held; a leader gets a new port."""
    nodes = [ib_node(f"n{i}", "ib-a", "mlx5_0", gpus=4) for i in range(1, 3)]
    placer = fit.Placer(nodes)
    first = fit.place_group(placer, "big", spec(gpus=2, nnodes=2, placement="binpack"))
    second = fit.place_group(placer, "big", spec(gpus=2, nnodes=2, placement="binpack"))
    assert isinstance(first, fit.Group) and isinstance(second, fit.Group)
    assert [r.gpus for r in first.ranks] == [(0, 1), (0, 1)] and [r.gpus for r in second.ranks] == [(2, 3), (2, 3)]
    assert first.leader_addr == second.leader_addr and first.leader_port != second.leader_port
    third = fit.place_group(placer, "big", spec(gpus=2, nnodes=2, placement="binpack"))
    assert isinstance(third, fit.Refused) and "no node has 2 free GPUs" in third.message


def test_adapters_that_are_down_do_not_count() -> None:
    """A node whose only adapter on the fabric is down is no rank; the refusal says which fabric falls short."""
    nodes = [ib_node("n1", "ib-a", "mlx5_0"), ib_node("n2", "ib-a", "mlx5_0", down=("mlx5_0",)),
             node("n3", gpus=(gpu(0), gpu(1)))]
    out = fit.place_group(fit.Placer(nodes), "big", spec(gpus=2, nnodes=2))
    assert isinstance(out, fit.Refused)
    assert out.message.startswith("no node can run a multi-node replica of big: no declared fabric has 2 nodes "
                                  "that fit, each with usable adapters; n1 is on fabric ib-a, which has 1 of the 2 "
                                  "nodes needed; ")
    assert out.reasons["n2"] == out.reasons["n3"] == "has no usable adapter on a declared fabric"


def test_group_members_pass_the_same_filters() -> None:
    """A cordoned node or one without the engine is not a rank either."""
    # vLLM: an engine that runs one replica over several nodes (llama.cpp does not, and is refused first).
    nodes = [ib_node("n1", "ib-a", "mlx5_0", engines=("vllm",)),
             ib_node("n2", "ib-a", "mlx5_0", engines=("vllm",), cordoned=True),
             ib_node("n3", "ib-a", "mlx5_0", engines=("sim",))]
    out = fit.place_group(fit.Placer(nodes), "big", spec(engine="vllm", source="/m", gpus=2, nnodes=2))
    assert isinstance(out, fit.Refused)
    assert out.reasons["n2"] == "is cordoned" and out.reasons["n3"].startswith("lacks engine vllm")
