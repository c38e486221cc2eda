#!/usr/bin/env python3
"""A slow link in front of PostgreSQL, for what-if runs of the bench: a TCP listener on
127.0.0.1 that forwards each connection to a server's Unix socket and holds every chunk it
forwards for a fixed time, in one direction or both, keeping each direction's order.

    bench/claim_cost/slow_link.py LISTEN_PORT SOCKET DELAY_MS [one-way|both]
    bench/claim_cost/slow_link.py 5599 /tmp/pgdev/.s.PGSQL.5499 0.1 one-way &
    /usr/lib/postgresql/15/bin/pgbench -n -c1 -T 4 -f select1.sql \\
        "host=127.0.0.1 port=5599 dbname=idemkafka_test user=postgres"   # the round trip it makes
    IDEMKAFKA_TEST_PG="host=127.0.0.1 port=5599 dbname=idemkafka_test user=postgres" \\
        bench/claim_cost/ab.sh A B --rounds 3 --events 50000 ...

The event loop's timers are coarse (about a millisecond): any delay above zero makes a round
trip of at least a millisecond or so. Measure the round trip it gives (pgbench with `SELECT 1`,
as above) and quote that, not DELAY_MS. `one-way` delays only what the server sends back (the
default delays both directions).
"""
import asyncio
import sys
import time


def usage() -> None:
    print(__doc__, file=sys.stderr)
    sys.exit(2)


if len(sys.argv) not in (4, 5) or (len(sys.argv) == 5 and sys.argv[4] not in ("one-way", "both")):
    usage()
try:
    LISTEN_PORT = int(sys.argv[1])
    DELAY = float(sys.argv[3]) / 1000.0
except ValueError:
    usage()
SOCKET = sys.argv[2]
ONE_WAY = len(sys.argv) == 5 and sys.argv[4] == "one-way"


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Forwards what `reader` gives to `writer`, each chunk `delay` seconds after it came."""
    queue: asyncio.Queue = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            if data is None:
                writer.close()
                return
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    while True:
        data = await reader.read(65536)
        await queue.put((time.monotonic() + delay, data or None))
        if not data:
            break
    await sender


async def connection(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
    server_reader, server_writer = await asyncio.open_unix_connection(SOCKET)
    await asyncio.gather(
        pump(client_reader, server_writer, 0.0 if ONE_WAY else DELAY),
        pump(server_reader, client_writer, DELAY),
        return_exceptions=True,
    )


async def main() -> None:
    server = await asyncio.start_server(connection, "127.0.0.1", LISTEN_PORT)
    async with server:
        await server.serve_forever()


asyncio.run(main())
