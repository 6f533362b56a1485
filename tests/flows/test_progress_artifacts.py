"""Progress inside a real Prefect flow run becomes a progress artifact updated to 100%, with counts and ETA."""

from __future__ import annotations


def test_tracked_loop_in_a_flow_is_a_progress_artifact(prefect_harness) -> None:
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    import tasks  # noqa: F401 - installs the Prefect progress sink
    import tasks.progress as tp
    from infra import progress

    tp.MIN_INTERVAL_S = 0.0
    progress.unregister_sink(tp.prefect_sink)
    progress.register_sink(tp.prefect_sink, 0.0)

    @task
    def work() -> None:
        with progress.track("probe loop", total=3, unit="question") as bar:
            for _ in range(3):
                bar.advance()

    @flow(name="progress-probe")
    def probe() -> None:
        work()

    probe()
    with get_client(sync_client=True) as client:
        key = ArtifactFilterKey(like_="progress-probe-loop-work-")  # loop name + task run name
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=key))
    assert arts and arts[0].type == "progress"
    assert float(arts[0].data) == 100.0
    assert arts[0].description.startswith("probe loop: 3/3 question (100%)")
