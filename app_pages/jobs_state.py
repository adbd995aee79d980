"""This session's conversion jobs and the machine-wide queue."""

from __future__ import annotations

import streamlit as st

from analyzer import fmt
from analyzer.convert.builds_folder import machine_queue, queue
from analyzer.convert.jobs import BuildJob, JobSnapshot
from analyzer.report.catalog import (
    builds_root,
)
from app_pages.session_keys import Key


def start_job(job: BuildJob) -> None:
    st.session_state.setdefault(Key.BUILDS_JOBS, []).append(job.start())


def job_snapshots() -> list[JobSnapshot]:
    return [j.snapshot() for j in st.session_state.get(Key.BUILDS_JOBS, [])]


def running_keys() -> set[str]:
    """Build keys converting now into this builds folder: this session's jobs and the machine-wide queue."""
    keys = {k for s in job_snapshots() if not s.finished for k in s.keys}
    root = builds_root()
    mine = str(root.resolve())  # the same key in another builds folder is another build
    return keys | {e.key for e in queue(root)} | {e.key for e in machine_queue() if e.root == mine}


def measured_beside_estimate(s: JobSnapshot) -> str:
    """``peak 1.31 GB measured (estimated 1.20 GB, -8% off); 42 s, 61 CPU-s (estimated ~58 CPU-s, ~29 s on an idle
    machine)``: what a finished conversion measured (its process tree's peak RSS and CPU time, ``TreeWatch``), beside
    the estimate the page showed before it started. CPU time is compared, not wall time: other work on the machine
    stretches the wall time, not the CPU time."""
    built = any(not r.reused for r in s.results)
    if not built or not s.peak_rss_tree_bytes:
        return ""
    peak = f"peak {fmt.size(s.peak_rss_tree_bytes, 'auto-si', None)} measured"
    took = f"{s.elapsed_s:,.0f} s, {s.cpu_s:,.0f} CPU-s"
    if s.estimate is None:
        return f"{peak}; {took}"
    e = s.estimate
    off = e.peak_rss_bytes / s.peak_rss_tree_bytes - 1
    return (f"{peak} (estimated {fmt.size(e.peak_rss_bytes, 'auto-si', None)}, {off:+.0%} off); {took} "
            f"(estimated ~{e.cpu_s:,.0f} CPU-s, ~{e.wall_s:,.0f} s on an idle machine)")
