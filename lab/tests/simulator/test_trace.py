"""Trace files: CSV and JSONL entries, schedules over a pod's life, clear errors, and round trips."""

from __future__ import annotations

import pytest

from gpufleet_lab.simulate.trace import Schedule, TraceError, load_trace, parse_schedule, write_trace


def test_csv_and_jsonl_read_the_same_pods(tmp_path):
    csv_path = tmp_path / "t.csv"
    csv_path.write_text(
        "arrival,namespace,resource,count,duration,util,mem_gb,name\n"
        "5,llm-inference,gpu,4,600,0.9,70,big\n"
        "0,imagegen,3g.40gb,,300,0:0.1 60:0.95 120:0.1,30,burst\n"
    )
    jsonl_path = tmp_path / "t.jsonl"
    jsonl_path.write_text(
        '{"arrival": 5, "namespace": "llm-inference", "resource": "nvidia.com/gpu", "count": 4, "duration": 600,'
        ' "util": 0.9, "mem_gb": 70, "name": "big"}\n'
        "# comments and blank lines are skipped\n\n"
        '{"arrival": 0, "namespace": "imagegen", "resource": "nvidia.com/mig-3g.40gb", "duration": 300,'
        ' "util": [[0, 0.1], [60, 0.95], [120, 0.1]], "mem_gb": 30, "name": "burst"}\n'
    )
    from_csv, from_jsonl = load_trace(csv_path), load_trace(jsonl_path)
    assert from_csv.pods == from_jsonl.pods
    burst, big = from_csv.pods  # sorted by arrival
    assert (burst.name, burst.resource, burst.count) == ("burst", "nvidia.com/mig-3g.40gb", 1)
    assert (big.resource, big.count, big.mem_gb.at(0)) == ("nvidia.com/gpu", 4, 70)
    assert [burst.util.at(t) for t in (0, 59.9, 60, 119, 120, 1e6)] == [0.1, 0.1, 0.95, 0.95, 0.1, 0.1]
    assert from_csv.end == 605


def test_schedule_knows_when_it_next_changes():
    schedule = parse_schedule("0:0.2 30:0.8", "util", 1.0)
    assert schedule.at_until(10) == (0.2, 30)
    assert schedule.at_until(30) == (0.8, float("inf"))
    assert Schedule.constant(0.5).at_until(1e9) == (0.5, float("inf"))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1,ns,gpu,1,60,1.5,0", r"util must be a finite number in 0..1"),
        ("1,ns,tpu,1,60,0.5,0", r"resource 'tpu' is not nvidia.com/gpu"),
        ("1,ns,gpu,1.5,60,0.5,0", "count must be a whole number"),
        ("1,ns,gpu,1,0,0.5,0", "duration must be above 0"),
        ("1,ns,gpu,1,60,10:0.5,0", "util: steps must start at offset 0"),
        ("1,,gpu,1,60,0.5,0", "needs a namespace or a tenant"),
    ],
)
def test_bad_entries_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.csv"
    path.write_text(f"arrival,namespace,resource,count,duration,util,mem_gb\n0,ns,gpu,1,60,0.5,0\n{line}\n")
    with pytest.raises(TraceError, match=rf"bad.csv:3: {message}"):
        load_trace(path)


def test_unknown_fields_and_formats_are_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 0, "namespace": "ns", "resource": "gpu", "duration": 1, "gpus": 2}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:1: unknown field\(s\) \['gpus'\]"):
        load_trace(path)
    with pytest.raises(TraceError, match=r"use a \.csv or \.jsonl file"):
        load_trace(tmp_path / "t.txt")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_written_traces_read_back_unchanged(tmp_path, suffix):
    source = tmp_path / "in.jsonl"
    source.write_text(
        '{"arrival": 0, "tenant": "finnlp", "resource": "1g.10gb", "duration": 90, "util": 0.4, "mem_gb": 5}\n'
        '{"arrival": 2.5, "namespace": "imagegen", "resource": "2g.20gb", "duration": 300,'
        ' "util": [[0, 0.9], [45, 0.1]], "mem_gb": [[0, 12], [45, 14.5]]}\n'
    )
    trace = load_trace(source)
    copy = tmp_path / f"out{suffix}"
    write_trace(trace, copy)
    assert load_trace(copy).pods == trace.pods
