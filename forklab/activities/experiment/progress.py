"""The run's progress in the artifact store: an index of segments, merged activity-side.

A durable experiment records one ``PrefixResult`` per chunk and one ``BatchOutcome`` per
world and chunk: ~650,000 episodes × 8 worlds at 1,000 episodes a batch is ~2 MB of them,
Temporal's payload limit. So the records never travel through Temporal as one payload:
each save sends only the records made since the previous save (bounded by the run's
history limit) with the previous index's digest; the activity stores them as a segment
and a new index (the old one plus that segment's reference). Readers (the analysis, the
evidence log, a run that needs a window of prefix checkpoints) walk the index here, each
artifact verified against its digest by the store, since storage is not trusted.
"""

from __future__ import annotations

from forklab.activities.stores.artifacts import ArtifactError, ArtifactStore
from forklab.contracts.experiment import (
    BatchOutcome,
    PrefixRef,
    PrefixRefsInput,
    PrefixResult,
    Progress,
    ProgressIndex,
    ProgressSegment,
    SaveProgressInput,
    SegmentRef,
)


def _index(store: ArtifactStore, digest: str) -> ProgressIndex:
    return ProgressIndex.model_validate(store.get_json(digest))


def _segment(store: ArtifactStore, ref: SegmentRef) -> ProgressSegment:
    return ProgressSegment.model_validate(store.get_json(ref.digest))


def save_progress(store: ArtifactStore, inp: SaveProgressInput) -> str:
    """Store ``inp``'s records as a segment after ``inp.previous``; returns the new index's
    digest. Idempotent: the same input writes the same artifacts and returns the same
    digest, so a retried save is harmless."""
    index = (
        _index(store, inp.previous)
        if inp.previous
        else ProgressIndex(chunks=inp.chunks, segments=[])
    )
    if index.chunks != inp.chunks:
        raise ArtifactError(
            f"progress {inp.previous} is of a plan of {index.chunks} chunks, not {inp.chunks}"
        )
    segment = ProgressSegment(prefixes=inp.prefixes, batches=inp.batches)
    chunks = [p.chunk.index for p in inp.prefixes]
    ref = SegmentRef(
        digest=store.put_json(segment.model_dump(mode="json")),
        prefix_span=(min(chunks), max(chunks) + 1) if chunks else None,
    )
    index.segments.append(ref)
    return store.put_json(index.model_dump(mode="json"))


def read_progress(store: ArtifactStore, digest: str) -> Progress:
    """Every record of the stored progress ``digest``, prefixes by chunk and batches by
    chunk then world; a record saved again later (none is, today) replaces the earlier."""
    index = _index(store, digest)
    prefixes: dict[int, PrefixResult] = {}
    batches: dict[tuple[int, str], BatchOutcome] = {}
    for ref in index.segments:
        segment = _segment(store, ref)
        prefixes.update((p.chunk.index, p) for p in segment.prefixes)
        batches.update(((b.chunk.index, b.world), b) for b in segment.batches)
    return Progress(
        chunks=index.chunks,
        prefixes=[prefixes[i] for i in sorted(prefixes)],
        batches=[batches[k] for k in sorted(batches)],
    )


def prefix_refs(store: ArtifactStore, inp: PrefixRefsInput) -> list[PrefixRef]:
    """The prefix checkpoints of chunks ``inp.first`` .. ``inp.stop - 1`` that ran, by
    chunk; only the segments whose prefixes overlap those chunks are read."""
    refs: dict[int, PrefixRef] = {}
    for ref in _index(store, inp.progress).segments:
        span = ref.prefix_span
        if span is None or span[1] <= inp.first or span[0] >= inp.stop:
            continue
        for p in _segment(store, ref).prefixes:
            if inp.first <= p.chunk.index < inp.stop:
                refs[p.chunk.index] = p.ref()
    return [refs[i] for i in sorted(refs)]
