"""A TCP relay that holds every chunk for a fixed time in each direction.

Used by the cross-region harness only when the kernel has no ``netem`` qdisc: the rate
is still shaped by the kernel (``tbf`` on the veth pair), the propagation delay is added
here. Chunks are forwarded in order once due, so a long transfer is pipelined across
the delay as on a real long link, not stopped after every chunk.

    python delay_relay.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_SECONDS
"""

from __future__ import annotations

import asyncio
import sys
import time


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, chunk = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not chunk:
                writer.close()
                return
            writer.write(chunk)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while True:
            chunk = await reader.read(65536)
            await queue.put((time.monotonic() + delay, chunk))
            if not chunk:
                break
        await sender
    except (ConnectionError, asyncio.CancelledError):
        sender.cancel()
        writer.close()


async def main(host: str, port: int, target_host: str, target_port: int,
               delay: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer, delay), _pipe(up_reader, writer, delay),
                             return_exceptions=True)

    server = await asyncio.start_server(handle, host, port)
    print("relay ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    h, p, th, tp, d = sys.argv[1:6]
    asyncio.run(main(h, int(p), th, int(tp), float(d)))
