import torch, time
torch.set_num_threads(1)
from circuits import VQC
torch.manual_seed(0)
m = VQC(4, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring", observable="z", output="linear", scaling="trainable", grad="parameter_shift", dtype="complex128")
e = VQC(4, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring", observable="z", output="linear", scaling="trainable", dtype="complex128")
e.load_state_dict(m.state_dict())
x = torch.randn(3, 4)
a = m(x); b = e(x)
print((a-b).abs().max())
ga = torch.autograd.grad(a.sum(), list(m.parameters())); gb = torch.autograd.grad(b.sum(), list(e.parameters()))
for (n,_), u, v in zip(m.named_parameters(), ga, gb): print(n, (u-v).abs().max().item())
print(m.resource_counts)
# noise + reupload + param shift
m = VQC(3, 2, n_qubits=3, layers=2, ansatz="strongly_entangling", reupload=True, preprocess="linear", noise=dict(depolarizing=0.05, amplitude_damping=0.1), grad="parameter_shift", dtype="complex128")
e = VQC(3, 2, n_qubits=3, layers=2, ansatz="strongly_entangling", reupload=True, preprocess="linear", noise=dict(depolarizing=0.05, amplitude_damping=0.1), dtype="complex128")
e.load_state_dict(m.state_dict())
x = torch.randn(3, 3)
a = m(x); b = e(x)
ga = torch.autograd.grad(a.sum(), list(m.parameters())); gb = torch.autograd.grad(b.sum(), list(e.parameters()))
for (n,_), u, v in zip(m.named_parameters(), ga, gb): print(n, (u-v).abs().max().item())
print(m.resource_counts)
# shots timing
m = VQC(4, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring", observable="p0", output="relu_linear", scaling="atan", shots=1024)
x = torch.randn(1024, 4)
with torch.no_grad():
    m(x); s=time.perf_counter(); [m(x) for _ in range(20)]; print("shots act", (time.perf_counter()-s)/20*1e3)
import pickle, copy
m2 = pickle.loads(pickle.dumps(m))
with torch.no_grad(): print(torch.equal(m(x), m2(x)))
