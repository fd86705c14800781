package cli

import "syscall"

// rankProcAttr makes a local rank die with its launcher (a launcher killed by SIGKILL
// cannot stop its ranks itself, and they would decode on, holding the machine).
func rankProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
