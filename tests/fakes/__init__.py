"""Shared fakes and helpers of the tests, in one place.

Stand-ins for outside parties: NVML (nvml_standin.py), a multi-GPU process tree (multigpu_tree.py),
the daemon on the NVML stand-in (standin_daemon.py), real Prometheus and daemon processes
(promserver.py, promql.py); scene builders for the verdict (verdict_scenes.py); an HTML reader for
the status page (pagedom.py); an engine's page read and normalised at once (engine_reads.py); a clock that stands still until a test moves it (clock.py); waits that
poll under a deadline instead of sleeping (wait.py). `engine/` holds the engine stand-ins (vLLM's
metric definitions in vllm_sim.py, a fake vLLM server, namespaced engines) and the fixture generators; tests/conftest.py
puts it on sys.path, because spawned simulation processes import `vllm_sim` by name.
The agent's fake torch, vLLM and SGLang packages stay in tests/agent/: only the agent's tests use them.
"""
