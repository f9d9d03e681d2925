// Behavioural models of the ECP5 primitives that the LiteEth RGMII core instantiates
// (hdl/net/core/liteeth_migen.py), for simulation; Yosys and nextpnr use the real cells.
//
// Cycle behaviour only: DELAYG is a wire (no picoseconds in a cycle-based simulator), so
// the testbench's RGMII model must present data a half period before the edge that
// samples it, as cocotbext-eth's RgmiiSource does (it changes data on the opposite edge).
// Port lists match Yosys's techlibs/ecp5 cells_bb.v; GSR-initialised state starts at the
// value the device gives it after configuration.

// Input DDR: D sampled on both edges of SCLK; at each rising edge Q0/Q1 present the
// samples of the previous rising and the falling edge after it (first, then second).
module IDDRX1F #(parameter GSR = "ENABLED") (
    input  D, SCLK, RST,
    output reg Q0 = 1'b0,
    output reg Q1 = 1'b0
);
    reg rise = 1'b0, fall = 1'b0;
    always @(posedge SCLK) rise <= D;
    always @(negedge SCLK) fall <= D;
    always @(posedge SCLK) begin
        Q0 <= rise;
        Q1 <= fall;
    end
endmodule

// Output DDR: D0 and D1 registered at the rising edge of SCLK; Q drives D0 while SCLK is
// high and D1 while it is low (D0 = 1, D1 = 0 forwards the clock itself).
module ODDRX1F #(parameter GSR = "ENABLED") (
    input  SCLK, RST, D0, D1,
    output Q
);
    reg d0 = 1'b0, d1 = 1'b0;
    always @(posedge SCLK) begin
        d0 <= D0;
        d1 <= D1;
    end
    assign Q = SCLK ? d0 : d1;
endmodule

// Fixed input/output delay: a wire here (see above).
module DELAYG #(parameter DEL_MODE = "USER_DEFINED", parameter DEL_VALUE = 0) (
    input  A,
    output Z
);
    assign Z = A;
endmodule

// Flip-flop with asynchronous preset (LiteX's AsyncResetSynchronizer on ECP5); GSR sets it.
module FD1S3BX #(parameter GSR = "ENABLED") (
    input  PD, D, CK,
    output reg Q = 1'b1
);
    always @(posedge CK or posedge PD)
        if (PD) Q <= 1'b1;
        else    Q <= D;
endmodule
