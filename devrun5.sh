#!/bin/bash
mkdir -p build/carry/x && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" build/carry/fa3-carry.tar.xz build/carry/x
build/carry/x/fa3-bench --host
build/carry/x/fa3_tests --gtest_filter='FwdGpu.Decode*:FwdGpu.CombineAgainstCpu:FwdGpu.EveryInstantiationByName' 2>&1 | grep -E "^\[  (FAILED|PASSED|  OK)|Failure" | head -20
