"""Angle encodings: feature x_i as a rotation R_P(x_i) on qubit i (after H_i with ``hadamard: true``)."""
from circuits.blocks import Encoding, register

ANGLE_X = register(Encoding("angle_x", "rx", "RX(x_i) on qubit i"))
ANGLE_Y = register(Encoding("angle_y", "ry", "RY(x_i) on qubit i"))
ANGLE_Z = register(Encoding("angle_z", "rz", "RZ(x_i) on qubit i (a global phase unless hadamard: true)"))
