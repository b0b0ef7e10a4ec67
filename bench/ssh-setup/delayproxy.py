#!/usr/bin/env python3
"""TCP delay proxy for bench.py: delayproxy.py DELAY_MS LISTEN=TARGET [LISTEN=TARGET ...]
(ports on 127.0.0.1). Every byte is forwarded DELAY_MS later, in each direction, order kept;
EOF too. No rate limit, no loss."""
import asyncio, socket, sys

DELAY = float(sys.argv[1]) / 1000


async def pump(reader, writer, done):
    loop = asyncio.get_running_loop()
    q = asyncio.Queue()

    async def send():
        try:
            while True:
                due, data = await q.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass

    t = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(1 << 18)
            q.put_nowait((loop.time() + DELAY, data or None))
            if not data:
                break
    except (ConnectionError, OSError):
        q.put_nowait((loop.time() + DELAY, None))
    await t
    done.append(1)


async def handle(target, creader, cwriter):
    try:
        ureader, uwriter = await asyncio.open_connection("127.0.0.1", target)
    except OSError:
        cwriter.close()
        return
    for w in (cwriter, uwriter):
        s = w.get_extra_info("socket")
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    done = []
    await asyncio.gather(pump(creader, uwriter, done), pump(ureader, cwriter, done))
    for w in (cwriter, uwriter):
        w.close()


async def main():
    servers = []
    for m in sys.argv[2:]:
        listen, target = (int(x) for x in m.split("="))
        servers.append(await asyncio.start_server(lambda r, w, t=target: handle(t, r, w), "127.0.0.1", listen, reuse_address=True))
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


asyncio.run(main())
