"""Angle encodings: feature x_i as a rotation R_P(x_i) on qubit i (after H_i with ``hadamard: true``)."""
from circuits.blocks import Encoding, register

register(Encoding("angle_x", "rx", "RX(x_i) on qubit i"))
register(Encoding("angle_y", "ry", "RY(x_i) on qubit i"))
register(Encoding("angle_z", "rz", "RZ(x_i) on qubit i (a global phase unless hadamard: true)"))
