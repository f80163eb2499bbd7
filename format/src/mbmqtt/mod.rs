//! MBMQTT01 broker.snapshot, Disk V1/V2/V3: the legacy format saguin reads.
