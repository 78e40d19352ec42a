"""Two wanxport flows against one over allreduce-4route in the multi-flow simulator, per core packet size:
    python docs/results/s17/twoflow.py 64 32 16   (from the checkout root; prints completion, re-sent MB, link drops)"""
import json, sys
from wanxport.scenario import load_scenario
from wanxport.sim.multi import FlowSpec, MultiRun
sc = load_scenario("emulation/scenarios/allreduce-4route.toml")
links = tuple(p.name for p in sc.paths)
MiB = 1 << 20
def run(n, size, dpp=64, opts=None):
    flows = [FlowSpec(f"f{i}", links, size_bytes=size, shards=1, datagrams_per_packet=dpp, cc_options=opts or {}) for i in range(n)]
    rep = MultiRun(sc, flows, 60.0).run()
    return rep
for dpp in [int(x) for x in sys.argv[1:]]:
    for n, size in ((1, 64 * MiB), (2, 32 * MiB)):
        rep = run(n, size, dpp)
        drops = {k: v for k, v in rep["links"].items()} if isinstance(rep["links"], dict) else rep["links"]
        print(dpp, n, "flows", [round(f["completion_s"], 3) for f in rep["flows"]], "retx MB", [round(f["retransmitted_bytes"]/1e6, 1) for f in rep["flows"]], json.dumps(drops)[:300])
