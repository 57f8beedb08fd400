"""kvexact_offload — vLLM's CPU offloading spec with a worker that runs on vLLM's CPU platform.

vLLM's OffloadingConnector with its CPU backend (CPUOffloadingSpec) refuses to start on the CPU
platform: its get_worker raises "CPU Offloading is currently only supported on CUDA-alike and XPU
GPUs", and the worker it would build (CPUOffloadingWorker) copies with CUDA streams and asserts its
source tensors are on a CUDA or XPU device. Everything else of the connector is platform-free.

HostCopyOffloadingSpec is CPUOffloadingSpec — its CPUOffloadingManager (capacity from
cpu_bytes_to_use, LRU eviction, the offloading events), the connector's scheduler side and its
OffloadingEventsTracker (self_describing_kv_events) all as released — with one method replaced:
get_worker returns HostCopyWorker, which copies each job's blocks between the engine's KV cache
tensors and a host buffer with torch indexing, synchronously, and reports the job finished. It is
loaded through the connector's out-of-tree spec hook:

  --kv-transfer-config '{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
    "kv_connector_extra_config":{"spec_name":"HostCopyOffloadingSpec",
    "spec_module_path":"kvexact_offload","cpu_bytes_to_use":N,"self_describing_kv_events":true}}'

with this folder on PYTHONPATH (engines/vllm/vllmpool sets both, docs/vllm-engine.md). Only one
offloaded block per chunk (blocks_per_chunk 1, the default when the offloaded block size is the
engine's) and one KV-cache group are supported; anything else is refused at start.
"""
import time

import torch

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec


class HostCopyWorker(OffloadingWorker):
    """Copies blocks between the engine's KV cache and host buffers of num_chunks blocks."""

    def __init__(self, kv_caches: CanonicalKVCaches, num_chunks: int, blocks_per_chunk: int):
        if blocks_per_chunk != 1:
            raise ValueError(f"kvexact_offload: blocks_per_chunk {blocks_per_chunk}, only 1 is supported")
        if len(kv_caches.group_data_refs) != 1:
            raise ValueError(f"kvexact_offload: {len(kv_caches.group_data_refs)} KV-cache groups, only 1 is supported")
        self.device = [t.tensor for t in kv_caches.tensors]
        self.host = [torch.zeros((num_chunks,) + tuple(t.shape[1:]), dtype=t.dtype) for t in self.device]
        self.finished: list[TransferResult] = []

    def _copy(self, job_id: int, dst: list[torch.Tensor], dst_ids, src: list[torch.Tensor], src_ids) -> bool:
        if len(dst_ids) != len(src_ids):
            raise ValueError(f"kvexact_offload: job {job_id} copies {len(src_ids)} blocks into {len(dst_ids)}")
        start = time.perf_counter()
        d, s = torch.from_numpy(dst_ids).long(), torch.from_numpy(src_ids).long()
        size = 0
        for to, frm in zip(dst, src):
            to.index_copy_(0, d, frm.index_select(0, s))
            size += len(src_ids) * frm[0].numel() * frm.element_size()
        self.finished.append(TransferResult(job_id=job_id, success=True, transfer_size=size,
                                            transfer_time=time.perf_counter() - start))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._copy(job_id, self.host, dst_spec.block_ids, self.device, src_spec.block_ids)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._copy(job_id, self.device, dst_spec.block_ids, self.host, src_spec.block_ids)

    def get_finished(self) -> list[TransferResult]:
        done, self.finished = self.finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return  # every job finishes in its submit call


class HostCopyOffloadingSpec(CPUOffloadingSpec):
    """CPUOffloadingSpec whose worker runs on the CPU platform (HostCopyWorker)."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = HostCopyWorker(kv_caches, self.num_chunks, self.blocks_per_chunk)
        return self._worker
