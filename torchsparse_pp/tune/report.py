"""The table `torchsparse-pp tune` prints."""
from .binding import PASSES
from .space import config_name


def _chosen(configs, mode: str) -> str:
    if mode == "inference":
        return config_name(configs.forward)
    names = [config_name(getattr(configs, p)) for p in PASSES]
    if len(set(names)) == 1:
        return names[0]
    return " | ".join(f"{p[0]}:{n}" for p, n in zip(PASSES, names))


def format_table(result) -> str:
    """Per group: its map, members, pairs, build time, chosen config, forward time of its layers
    before and after, and the end-to-end time its slots saved in the search; then the totals."""
    saved = {}
    for s in result.search.slots:
        if s.start_seconds is not None:
            saved[s.group] = saved.get(s.group, 0.0) + s.start_seconds - s.seconds
    # The search bar showed the greedy picks; when the final check overruled them, show both.
    greedy = result.search.assignment
    overruled = any(greedy[g.name] != result.assignment[g.name] for g in result.groups)
    header = ["group", "map", "layers", "pairs", "build ms", "chosen"] + (["greedy pick"] if overruled else [])
    rows = [tuple(header + ["fwd ms default->tuned", "e2e ms saved"])]
    for g in result.groups:
        picks = [_chosen(result.assignment[g.name], result.mode)]
        if overruled:
            picks.append(_chosen(greedy[g.name], result.mode))
        rows.append((g.name, g.describe(), str(len(g.layers)), f"{g.pairs:,}", f"{1e3 * g.build_seconds:.1f}", *picks,
                     f"{1e3 * result.group_seconds_before[g.name]:.1f} -> {1e3 * result.group_seconds_after[g.name]:.1f}",
                     f"{1e3 * saved.get(g.name, 0.0):.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if overruled:
        lines.append(f"chosen: {result.selected}, the fastest in the final check; the greedy picks (as the search "
                     "bar showed them) measured slower there")
    lines.append("")
    lines.append("members:")
    lines += [f"  {g.name}: {', '.join(g.layer_names)}" for g in result.groups]
    if result.unreached:
        lines.append(f"  not reached by the sample (left as they are): {', '.join(result.unreached)}")
    uniforms = result.uniform_stats()
    best_uniform = min(uniforms, key=lambda n: uniforms[n]["median_s"])
    before, after = result.before_seconds, result.after_seconds
    lines.append("")
    lines.append(f"end to end ({result.mode}{', binding ' + result.binding if result.binding else ''}, "
                 f"{result.samples} sample(s), {result.device_name}):")
    width = max(len(name) for name in result.final)
    for name, stats in sorted(result.final.items(), key=lambda kv: kv[1]["median_s"]):
        mark = "  <- selected" if name == result.selected else ""
        lines.append(f"  {name:<{width}} {1e3 * stats['median_s']:9.1f} ms  "
                     f"[{1e3 * stats['min_s']:.1f}, {1e3 * stats['max_s']:.1f}]{mark}")
    lines.append(f"default {1e3 * before:.1f} ms -> tuned {1e3 * after:.1f} ms ({before / after:.2f}x); best uniform "
                 f"{best_uniform} ({before / uniforms[best_uniform]['median_s']:.2f}x); "
                 f"{len(result.search.trials)} trials in {result.tuning_seconds:.0f} s")
    return "\n".join(lines)
