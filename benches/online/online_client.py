"""The client side of benches/online.py: streamed requests over aiohttp, sent on a
schedule, optionally from several forked processes that share it. Each request's record
holds the times the client saw (time.perf_counter, one clock for all processes on Linux);
benches/online_metrics.py turns them into metrics."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from collections.abc import AsyncIterable, Callable

import aiohttp
from online_metrics import RequestRecord

Job = tuple[float, bytes, RequestRecord]  # (send offset in s, request body, its record)


async def read_stream(lines: AsyncIterable[bytes], rec: RequestRecord, chat: bool,
                      clock: Callable[[], float] = time.perf_counter) -> None:
    """Fills `rec` from an SSE body, one line at a time (each stamped as it arrives)."""
    parts = []
    try:
        async for raw in lines:
            now = clock()
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, comments
            data = line[5:].strip()
            if data == b"[DONE]":
                rec.end = now
                return
            event = json.loads(data)
            if "error" in event:
                rec.error = f"error event: {json.dumps(event['error'])[:200]}"
                rec.end = now
                return
            if choices := event.get("choices"):
                content = (choices[0].get("delta") or {}).get("content") if chat \
                    else choices[0].get("text")
                if content:
                    rec.chunks.append(now)
                    parts.append(content)
            if usage := event.get("usage"):
                rec.usage_prompt = usage.get("prompt_tokens")
                rec.usage_output = usage.get("completion_tokens")
        rec.error = "the stream ended before [DONE]"
        rec.end = clock()
    finally:
        rec.text = "".join(parts)


async def send(session: aiohttp.ClientSession, url: str, body: bytes, rec: RequestRecord,
               chat: bool) -> None:
    rec.sent = time.perf_counter()
    try:
        async with session.post(url, data=body,
                                headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                rec.end = time.perf_counter()
                return
            await read_stream(resp.content, rec, chat)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:200]
        rec.end = time.perf_counter()


async def drive(url: str, jobs: list[Job], start: float, concurrency: int | None,
                timeout_s: float, chat: bool) -> None:
    """Sends each job at start + its offset (perf_counter time), at most `concurrency`
    in flight (a request waiting for a slot starts its clock when it gets one, as vllm)."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    sem = asyncio.Semaphore(concurrency) if concurrency else None

    async def one(body: bytes, rec: RequestRecord) -> None:
        if sem is None:
            return await send(session, url, body, rec, chat)
        async with sem:
            await send(session, url, body, rec, chat)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = []
        for offset, body, rec in jobs:
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(body, rec)))
        await asyncio.gather(*tasks)


def _client(k: int, url: str, jobs: list[Job], start: float, concurrency: int | None,
            timeout_s: float, chat: bool, queue) -> None:
    asyncio.run(drive(url, jobs, start, concurrency, timeout_s, chat))
    queue.put((k, [rec for _, _, rec in jobs]))


def run_jobs(url: str, jobs: list[Job], procs: int, concurrency: int | None,
             timeout_s: float, chat: bool) -> tuple[list[RequestRecord], float]:
    """-> (records in job order, the schedule's start). With procs > 1, job i goes to
    process i % procs and the concurrency limit is split between them."""
    procs = max(1, min(procs, len(jobs), concurrency or len(jobs)))
    start = time.perf_counter() + (0.5 if procs > 1 else 0.05)
    if procs == 1:
        asyncio.run(drive(url, jobs, start, concurrency, timeout_s, chat))
        return [rec for _, _, rec in jobs], start
    ctx = mp.get_context("fork")  # the children share the parent's clock and imports
    queue = ctx.Queue()
    shares = [concurrency // procs + (k < concurrency % procs) if concurrency else None
              for k in range(procs)]
    children = [ctx.Process(target=_client, args=(k, url, jobs[k::procs], start, shares[k],
                                                  timeout_s, chat, queue))
                for k in range(procs)]
    for c in children:
        c.start()
    records: list[RequestRecord] = [rec for _, _, rec in jobs]
    for _ in children:  # a child that died leaves its records unsent: fail, do not hang
        k, part = queue.get(timeout=timeout_s + 60)
        records[k::procs] = part
    for c in children:
        c.join()
    return records, start
