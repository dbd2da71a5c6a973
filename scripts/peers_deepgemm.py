"""DeepGEMM for scripts/bench_peers.py (issue 32, item 4): loading it, its scale layout, and the
parallel JIT warm-up that compiles every grouped GEMM kernel the grid will call before any cell is
timed.

DeepGEMM compiles each kernel on its first call (NVCC from CUDA_HOME; one kernel per scheme, expert
count E, N, K and the block config its heuristic picks for the row count M) and caches the cubin on
disk ($DG_JIT_CACHE_DIR, default ~/.deep_gemm). Compiled one by one inside the grid these compiles
used up the whole DeepGEMM budget after a few cells. prewarm() instead runs every (scheme, E, N, K, M)
the grid will call once, in worker processes (spawned: each its own CUDA context, so a CUDA fault
there cannot poison the timing process), several at a time: NVCC is single-threaded and the GPU
machine has 16 cores. Each job calls the same public entry point as the grid
(m_grouped_{fp8,bf16}_gemm_nt_contiguous, fp8 with raw f32 1x128 activation scales, so DeepGEMM's own
scale-transpose kernel is compiled too) on scratch tensors of the same shapes; the grid's first call
then loads the cached cubin. Jobs are started largest first while their tensors fit under a memory
limit (DeepSeek-V3's bf16 gate/up weights alone are 15 GB).

Nothing here is timed; no DeepGEMM code is copied, only its public functions are called.
Test: tests/python/test_bench_peers.py (the scheduling and the worker plumbing, on the CPU).
"""
import queue
import time

FP8_BLOCK = 128  # DeepGEMM's fp8 recipe: 1x128 activation scales, 128x128 weight block scales


def short(e):
    """One line of an exception for a CSV reason column."""
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:240]


def load_deepgemm():
    """((deep_gemm module, its per-expert row alignment), '') or (None, why it cannot be used)."""
    try:
        try:
            import deep_gemm
        except ImportError:  # not on PYTHONPATH: the copy inside an installed vLLM wheel
            from vllm.third_party import deep_gemm
        get = getattr(deep_gemm, "get_mk_alignment_for_contiguous_layout",
                      getattr(deep_gemm, "get_m_alignment_for_contiguous_layout", lambda: 128))
        return (deep_gemm, int(get())), ""
    except Exception as e:  # ImportError, an OSError of its extension, a CUDA init error
        return None, f"import deep_gemm failed: {short(e)}"


def sf_transform(lib):
    """DeepGEMM's public f32-scale relayout (MN-major, TMA-aligned: what its sm90 fp8 kernels read),
    or None when this version exports none. Given scales already in that layout, its GEMM entry point
    only checks them, so the GEMM-only peer times no transpose."""
    utils = getattr(lib, "utils", None)
    for owner in (lib, utils, getattr(utils, "layout", None), getattr(lib, "_C", None)):
        for name in ("get_mn_major_tma_aligned_tensor", "get_col_major_tma_aligned_tensor"):
            fn = getattr(owner, name, None)
            if callable(fn):
                return fn
    return None


def relayout(lib, log=print):
    """s -> s in DeepGEMM's fp8 scale layout (sf_transform), falling back to s itself, with one note,
    when this version has none or it fails: DeepGEMM then relays the scales inside the timed call."""
    fn, noted = sf_transform(lib), []

    def note(why):
        if not noted:
            noted.append(why)
            log(f"# deepgemm_gemms: 1x128 scales passed as they are ({why}); DeepGEMM relays them "
                "inside the timed calls", flush=True)

    def apply(s):
        nonlocal fn
        if fn is None:
            note("this deep_gemm exports no get_mn_major_tma_aligned_tensor")
            return s
        try:
            return fn(s)
        except Exception as e:
            fn = None
            note(short(e))
            return s
    return apply


def gemm_job(scheme, E, N, K, M):
    """One warm-up job: key (scheme, E, N, K, M) and the bytes of its scratch tensors on the GPU."""
    per = 2 if scheme == "bf16" else 1
    return {"key": (scheme, E, N, K, M), "bytes": E * N * K * per + M * K * per + M * N * 2 + 4 * M}


def pick_next(pending, in_flight_bytes, mem_limit):
    """Index of the first pending job (largest first) whose tensors fit beside the running ones;
    a job larger than the limit still runs, alone. None when nothing may start now."""
    for i, job in enumerate(pending):
        if in_flight_bytes + job["bytes"] <= mem_limit or in_flight_bytes == 0:
            return i
    return None


_LIB = None  # the worker process's deep_gemm


def warm_job(key):
    """Worker side: one DeepGEMM grouped GEMM of shape key = (scheme, E, N, K, M) on scratch tensors
    (every row routed to expert 0), which compiles (or loads) its kernels; raises on failure."""
    global _LIB
    import torch
    if _LIB is None:
        loaded, why = load_deepgemm()
        if loaded is None:
            raise RuntimeError(why)
        _LIB = loaded[0]
    scheme, E, N, K, M = key
    dev, bf16 = "cuda", torch.bfloat16
    d = torch.empty((M, N), dtype=bf16, device=dev)  # zero inputs: no NaN from scratch memory
    m_idx = torch.zeros(M, dtype=torch.int32, device=dev)
    if scheme == "bf16":
        a = torch.zeros((M, K), dtype=bf16, device=dev)
        b = torch.zeros((E, N, K), dtype=bf16, device=dev)
        _LIB.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_idx)
    else:
        fp8, f32, blk = torch.float8_e4m3fn, torch.float32, FP8_BLOCK
        a = (torch.zeros((M, K), dtype=torch.uint8, device=dev).view(fp8),
             torch.ones((M, K // blk), dtype=f32, device=dev))
        b = (torch.zeros((E, N, K), dtype=torch.uint8, device=dev).view(fp8),
             torch.ones((E, N // blk, K // blk), dtype=f32, device=dev))
        _LIB.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_idx)
    torch.cuda.synchronize()
    del a, b, d, m_idx
    torch.cuda.empty_cache()


def _worker(target, inbox, outbox):
    """A warm-up process: runs target(key) for each key it is sent until None; reports
    (key, seconds, error) for each ('' when it worked). Ends after a failure: a CUDA error is sticky,
    and the next job deserves a clean context (prewarm starts a new process)."""
    for key in iter(inbox.get, None):
        t0 = time.time()
        try:
            target(key)
            err = ""
        except BaseException as e:  # a failed compile, an unsupported shape, a CUDA error
            err = short(e)
        outbox.put((key, time.time() - t0, err))
        if err:
            return


def prewarm(jobs, workers, budget_s, mem_limit, log=print, target=warm_job, grace_s=60.0):
    """Runs target(job key) for every job in `workers` spawned processes, largest first, the running
    jobs' bytes under mem_limit. Starts no job after budget_s; stops waiting grace_s later (those
    workers are terminated). Returns {key: (seconds, error)}; a job never run is absent."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    pending = sorted({j["key"]: j for j in jobs}.values(), key=lambda j: -j["bytes"])
    outbox, procs, idle, running, done = ctx.Queue(), [], [], {}, {}
    start = time.time()

    def spawn(w):
        inbox = ctx.Queue()
        p = ctx.Process(target=_worker, args=(target, inbox, outbox), daemon=True)
        p.start()
        procs[w:w + 1] = [(p, inbox)]
        idle.append(w)

    def finish(w, key, sec, err):
        done[key] = (sec, err)
        log(f"# deepgemm jit {key[0]:9} E={key[1]:<3} N={key[2]:<5} K={key[3]:<5} M={key[4]:<6} "
            f"{sec:6.1f} s {err or 'ok'}", flush=True)
        del running[w]
        if not err:
            idle.append(w)
        elif pending and time.time() - start <= budget_s:  # the worker ended: a fresh one takes its place
            procs[w][0].join(timeout=5)
            spawn(w)

    try:
        for w in range(min(workers, len(pending))):
            spawn(w)
        while pending or running:
            spent = time.time() - start
            while pending and idle and spent <= budget_s:
                i = pick_next(pending, sum(j["bytes"] for j in running.values()), mem_limit)
                if i is None:
                    break
                w = idle.pop()
                running[w] = job = dict(pending.pop(i), t0=time.time())
                procs[w][1].put(job["key"])
            if not running or spent > budget_s + grace_s:
                break
            try:
                key, sec, err = outbox.get(timeout=1.0)
            except queue.Empty:
                for w, job in list(running.items()):  # a worker that died (a segfault in NVCC's caller)
                    if not procs[w][0].is_alive():
                        why = f"warm-up worker exited ({procs[w][0].exitcode})"
                        finish(w, job["key"], time.time() - job["t0"], why)
                continue
            finish(next(w for w, j in running.items() if j["key"] == key), key, sec, err)
        for job in running.values():
            done[job["key"]] = (time.time() - job["t0"], f"warm-up still running at {budget_s + grace_s:g} s")
    finally:
        for w, (p, inbox) in enumerate(procs):
            if w in running:  # busy past the budget (or interrupted): stop it now
                p.terminate()
            elif p.is_alive():
                inbox.put(None)
        for p, _ in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    return done
