"""CUDA-event timing shared by the Python benchmarks."""


def time_ms(torch, fn, rep, warmup=5):
    """Median over `rep` calls of fn's time in ms: CUDA events around each call, each call started on
    an idle GPU (the previous one synchronised), so the time includes the host's launch time of the
    call's kernels (what an eager step sees; compare.time_calls measures GPU time alone). torch is
    passed in so that importing this module needs no torch."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rep):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]
