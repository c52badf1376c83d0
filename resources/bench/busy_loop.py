"""A busy neighbour for the busy-machine runs: about half of one core, in bursts — 50 ms busy, 50 ms asleep, with a
3 s busy stretch every 20 s. Run it in the background beside a bench (`python resources/bench/busy_loop.py &`) and
kill it after; bench's `cpu_wait_share` warnings say how much the lanes waited for a CPU.
"""

import time


def main() -> None:
    t0 = time.monotonic()
    while True:
        now = time.monotonic()
        busy = 3.0 if int(now - t0) % 20 == 0 else 0.05
        end = now + busy
        while time.monotonic() < end:
            pass
        time.sleep(0.05)


if __name__ == "__main__":
    main()
