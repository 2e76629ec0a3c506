"""Sends UDP datagrams listed in a pickle file ([(payload, port), ...]) to one address: the
sending side of a test whose receiver lives in another network namespace (run with
`ip netns exec`)."""
import pickle
import socket
import sys


def main():
    path, dest = sys.argv[1], sys.argv[2]
    with open(path, "rb") as f:
        datagrams = pickle.load(f)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for payload, port in datagrams:
        s.sendto(payload, (dest, port))
    s.close()


if __name__ == "__main__":
    main()
