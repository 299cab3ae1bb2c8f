#pragma once

// Whether a host named on the command line is this machine, for deciding
// which agent hosts the rendezvous daemon (torch's c10d backend does the
// same by comparing names and addresses).

#include <string>

namespace meshrun::launcher {

// "localhost", 127.0.0.0/8 and ::1.
bool IsLoopback(const std::string& host);
// Loopback, this machine's host name (short or FQDN), or an address of one of
// its interfaces; a name is resolved first.
bool IsLocalAddress(const std::string& host);
std::string LocalHostName();
// Whether something accepts TCP connections at host:port right now.
bool SomethingListens(const std::string& host, int port);

}  // namespace meshrun::launcher
