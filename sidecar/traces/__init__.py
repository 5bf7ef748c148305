"""Saved Chrome traces, read without torch: find a capture, summarize it, merge it, lay it out for HTA.

This runs in the CLI on login nodes, so it imports only the standard library.

    reader   TraceReader, iter_events: stream one trace, one event at a time; who wrote it
    catalog  find_captures: one capture of a replica in <output>/profile_trace/<replica>_<rank>/;
             find_traces: a trace file, a directory or a replica name (via the registry) -> a FoundCapture;
             find_pair: the two captures of a diff (default_pair picks them for one side)
    summary  summarize: step times, compute vs collective wait, top ops and kernels per rank, the
             straggler (data; the CLI's words for it are sidecar.cli.render_traces')
    straggler  each step's collective wait (CollectiveIntervals), the straggler verdict (find_straggler)
    merge    merge: one timeline, a process track per rank, on one clock
    export   export_flat: one capture as a flat folder HolisticTraceAnalysis reads
    htmlreport  build_page: one capture as one self-contained HTML page (bars, verdict, top ops, links);
             build_diff_page: a diff as one
    diff     diff_traces: two captures (BASE [NEW]; find_pair finds them) -> what changed
    summaryfile  write_beside: one saved trace's <n>_summary.json (what a rank's child process runs); a
             replica's ranks whose traces are on another machine are read from the summaries they
             published (catalog.find_traces gathers them, summary.summarize_found reads them)

Each of summary, merge, export and htmlreport also has the function `profile summary|merge|export|report`
calls: `summarize_traces`, `merge_traces`, `export_traces`, `report_traces` (find_traces, then the above;
`diff_traces`: find_pair, then the diff).

    from sidecar.traces.catalog import find_captures
    from sidecar.traces.summary import summarize

    capture = find_captures(output_dir, "r1")        # latest capture: rank -> path
    result = summarize(capture.paths.values())       # a TraceSummary: steps, split, top ops, straggler

Import each name from its module: this package re-exports nothing, so a command that needs one
module loads only that one.
"""
